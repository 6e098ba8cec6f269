#include "pw/examples/figure2.h"

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/client/client.h"

namespace pw {

std::string Figure2Result::ToString() const {
  return absl::StrCat("(", y.ToString(), ", ", z.ToString(), ")");
}

namespace {
NativeFunctionDef Elementwise(const std::string& name, const std::string& kernel, double value) {
  NativeFunctionBuilder b(name);
  int x = b.Input({DType::kF32, Shape({})});  // pmap: each device holds one element.
  return b.Build({b.Op(kernel, {x}, {{"value", value}})});
}
}  // namespace

absl::StatusOr<Figure2Result> RunFigure2(ControllerInterface* controller) {
  PW_ASSIGN_OR_RETURN(auto client, Client::Connect(controller, "figure2"));
  // Allocates `n` virtual devices on an island.
  auto get_devices = [&](int n) {
    return client->MakeVirtualDeviceSet().AddSlice({.num_devices = n});
  };
  PW_ASSIGN_OR_RETURN(Slice sa, get_devices(2));
  PW_ASSIGN_OR_RETURN(Slice sb, get_devices(2));
  PW_ASSIGN_OR_RETURN(Slice sc, get_devices(2));
  PW_ASSIGN_OR_RETURN(BoundFunction a, client->Pmap(Elementwise("a", "mul_scalar", 2.0), sa));
  PW_ASSIGN_OR_RETURN(BoundFunction b, client->Pmap(Elementwise("b", "add_scalar", 1.0), sb));
  PW_ASSIGN_OR_RETURN(BoundFunction c, client->Pmap(Elementwise("c", "div_scalar", 2.0), sc));
  PW_ASSIGN_OR_RETURN(Program f, client->Trace("f", {{DType::kF32, Shape({2})}},
                                               [&](std::vector<Value> v) -> std::vector<Value> {
                                                 Value x = a(v[0]);
                                                 Value y = b(x);
                                                 Value z = a(c(x));
                                                 return {y, z};
                                               }));
  PW_ASSIGN_OR_RETURN(HostArray v, HostArray::Of<float>(DType::kF32, Shape({2}), {1.f, 2.f}));
  PW_ASSIGN_OR_RETURN(std::vector<Array> out, f.Call({v}));
  Figure2Result r;
  PW_ASSIGN_OR_RETURN(r.y, out[0].ToHost());
  PW_ASSIGN_OR_RETURN(r.z, out[1].ToHost());
  PW_ASSIGN_OR_RETURN(r.lowered, f.Explain());
  return r;
}

}  // namespace pw
