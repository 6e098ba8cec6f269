// libFuzzer target: every wire decoder (FromProto) on arbitrary bytes, and what the controller
// does next with what one accepts — a program lowered against a small cluster, a put array
// split into its shards — so a message that passes validation cannot crash the code behind it.
// A decoded value must encode and decode again to the same thing.
//
// Input: one selector byte, then a serialized message of the selected kind.
#include <cstddef>
#include <cstdint>

#include "pw/base/check.h"
#include "pw/executor/native_function.h"
#include "pw/program/lowering.h"
#include "pw/resource_manager/resource_manager.h"
#include "pw/rpc/proto/pathways.pb.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {
namespace {
namespace v1 = ::pathways::v1;

// Re-encodes a decoded value and decodes it again: must succeed.
template <typename Proto, typename T>
void RoundTrips(const T& value) {
  Proto again;
  ToProto(value, &again);
  PW_CHECK(FromProto(again).ok(), "a decoded value did not decode after re-encoding");
}

// Two islands of one host with two devices; slices 0 (2 devices) and 1 (4 devices, spread) for
// client 1; functions 0..2 native, as a controller would hold them.
class FuzzContext final : public LoweringContext {
 public:
  FuzzContext() : rm_(*ClusterSpec::Uniform(2, 1, 2, 1 << 20)) {
    slices_.push_back(*rm_.AllocateSlice(client_, {.num_devices = 2}));
    slices_.push_back(*rm_.AllocateSlice(
        client_, {.num_devices = 4, .placement = SlicePlacement::kSpread}));
    for (const char* k : {"add_scalar", "all_reduce_sum", "mul_scalar"}) {
      NativeFunctionBuilder b(k);
      int x = b.Input({DType::kF32, Shape({1})});
      fns_.push_back(b.Build({b.Op(k, {x}, {{"value", 1.0}})}));
    }
  }
  absl::StatusOr<SliceInfo> ResolveSlice(SliceId s) const override {
    return rm_.ResolveSlice(client_, s);
  }
  absl::StatusOr<FunctionSignature> LoadSignature(FunctionId f, int n) const override {
    if (!f.valid() || f.value() >= static_cast<int64_t>(fns_.size()))
      return absl::NotFoundError("no such function");
    return SignatureOf(fns_[f.value()], n);
  }
  const SliceInfo& slice(size_t i) const { return slices_[i % slices_.size()]; }

 private:
  ResourceManager rm_;
  ClientId client_{1};
  std::vector<SliceInfo> slices_;
  std::vector<NativeFunctionDef> fns_;
};

void Program(const uint8_t* data, size_t size) {
  v1::ProgramIr p;
  if (!p.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<ProgramIr> ir = FromProto(p);
  if (!ir.ok()) return;
  RoundTrips<v1::ProgramIr>(*ir);
  static const FuzzContext* ctx = new FuzzContext();
  // Arguments where their slice's devices take them, replicated (as a client's puts would be).
  std::vector<Placement> args;
  for (size_t i = 0; i < ir->args.size(); ++i) {
    const SliceInfo& s = ctx->slice(i);
    if (!ir->args[i].Validate().ok() || ir->args[i].shape.rank() > 8) return;
    args.push_back(PlacementOn(s, ir->args[i],
                               Sharding::Replicated({static_cast<int64_t>(s.devices.size())},
                                                    ir->args[i].shape.rank())));
  }
  absl::StatusOr<LoweredProgram> lowered = Lower(*ir, args, *ctx);
  if (lowered.ok()) (void)lowered->ToString();
}

// What Controller::PutArray does with a request: validate, then split into shards.
void PutArray(const uint8_t* data, size_t size) {
  v1::PutArrayRequest p;
  if (!p.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<HostArray> value = FromProto(p.mutable_value());
  absl::StatusOr<Sharding> sharding = FromProto(p.sharding());
  if (!value.ok() || !sharding.ok()) return;
  if (!value->spec.Validate().ok() ||
      static_cast<int64_t>(value->bytes.size()) != value->spec.size_bytes())
    return;
  if (!sharding->Validate(value->spec.shape).ok()) return;
  if (sharding->num_devices() > 64) return;  // The controller's slices bound it.
  const Box whole{std::vector<int64_t>(value->spec.shape.rank(), 0),
                  std::vector<int64_t>(value->spec.shape.dims().begin(),
                                       value->spec.shape.dims().end())};
  const ArraySpec shard_spec{value->spec.dtype, sharding->ShardShape(value->spec.shape)};
  if (shard_spec.size_bytes() > (int64_t{1} << 20)) return;
  for (int r = 0; r < sharding->num_devices(); ++r) {
    std::vector<uint8_t> shard(shard_spec.size_bytes());
    CopyBoxIntersection(value->bytes.data(), whole, shard.data(),
                        sharding->ShardBox(value->spec.shape, r), DTypeSize(value->spec.dtype));
  }
}

template <typename Proto>
void Decode(const uint8_t* data, size_t size) {
  Proto p;
  if (!p.ParseFromArray(data, static_cast<int>(size))) return;
  auto v = FromProto(p);
  if (v.ok()) RoundTrips<Proto>(*v);
}

void Function(const uint8_t* data, size_t size) {
  v1::FunctionDef p;
  if (!p.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<FunctionDef> def = FromProto(p);
  if (!def.ok()) return;
  RoundTrips<v1::FunctionDef>(*def);
  // What RegisterFunction checks (native functions compile against the kernel registry).
  for (int shards : {1, 2, 4}) (void)SignatureOf(*def, shards);
}

// A session's submit: its options decode, and encode back to the same options.
void Submit(const uint8_t* data, size_t size) {
  v1::SubmitRequest p;
  if (!p.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<RunOptions> o = RunOptionsFromProto(p);
  if (!o.ok()) return;
  v1::SubmitRequest again;
  ToProto(*o, &again);
  absl::StatusOr<RunOptions> back = RunOptionsFromProto(again);
  if (!back.ok() || back->mode != o->mode || back->timeout != o->timeout ||
      back->outputs != o->outputs || back->trace_flow != o->trace_flow)
    __builtin_trap();
}

}  // namespace
}  // namespace pw::rpc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pw::rpc;
  namespace v1 = ::pathways::v1;
  if (size == 0) return 0;
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  switch (data[0] % 11) {
    case 0: Program(body, n); break;
    case 1: PutArray(body, n); break;
    case 2: Function(body, n); break;
    case 3: Decode<v1::HostProgram>(body, n); break;
    case 4: Decode<v1::SliceRequest>(body, n); break;
    case 5: Decode<v1::SliceInfo>(body, n); break;
    case 6: Decode<v1::ArrayInfo>(body, n); break;
    case 7: Decode<v1::HostStatus>(body, n); break;
    case 8: Decode<v1::ClusterStatus>(body, n); break;
    case 9: Decode<v1::Sharding>(body, n); break;
    case 10: Submit(body, n); break;
  }
  return 0;
}
