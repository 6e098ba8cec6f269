// The registry of native host kernels, by name. Internal to the native backend.
#pragma once

#include "absl/strings/string_view.h"
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pw/base/shape.h"
#include "pw/executor/device_buffer.h"
#include "pw/executor/executable.h"

namespace pw::native {

using Attrs = std::map<std::string, double>;

struct KernelContext {
  absl::Span<const HostDeviceBuffer* const> operands;
  HostDeviceBuffer* output;
  const Attrs& attrs;
  const ShardLaunch& launch;  // For collectives: key, rank, slice devices, communicator.
  int op_index;
};

struct KernelDef {
  std::string name;
  int num_operands;
  std::vector<std::string> required_attrs;
  // Output spec from operand specs, for a slice of `num_shards` devices.
  std::function<absl::StatusOr<ArraySpec>(absl::Span<const ArraySpec>, const Attrs&,
                                          int num_shards)>
      infer;
  std::function<absl::Status(const KernelContext&)> run;
};

// Thread-safe after first use: the table is built once and then only read.
const KernelDef* FindKernel(absl::string_view name);
std::vector<std::string> KernelNames();

}  // namespace pw::native
