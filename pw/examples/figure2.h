// The paper's Figure 2 program, in the C++ client API:
//
//   a = pmap(lambda x: x * 2., devices=get_devices(2))
//   b = pmap(lambda x: x + 1., devices=get_devices(2))
//   c = pmap(lambda x: x / 2., devices=get_devices(2))
//   @pw.program
//   def f(v):
//     x = a(v); y = b(x); z = a(c(x)); return (y, z)
//   print(f(numpy.array([1., 2.])))   # (array([3., 5.]), array([2., 4.]))
#pragma once

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "pw/base/host_array.h"
#include "pw/transport/controller_interface.h"

namespace pw {

struct Figure2Result {
  HostArray y;
  HostArray z;
  std::string lowered;  // The sharded dataflow graph the program lowered to, for --explain.
  std::string ToString() const;  // "(array([3., 5.]), array([2., 4.]))"
};

absl::StatusOr<Figure2Result> RunFigure2(ControllerInterface* controller);

}  // namespace pw
