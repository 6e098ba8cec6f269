// PjrtShardExecutable: a StableHLO function as a runtime Executable, run shard by shard on one
// host's devices through a PJRT client (one PJRT device per local device of the slice).
//
// Compiled once per (function, slice shape) on each worker, as a portable executable that runs on
// whichever PJRT device backs the shard's device. Inputs that are not already PJRT buffers on that
// device (native kernels' outputs, put arrays) are staged through host memory. Outputs are PJRT
// buffers owned by the plugin; completion is the PJRT execution event.
//
// Thread-safe and immutable.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "pw/executor/executable.h"
#include "pw/executor/function_def.h"
#include "pw/pjrt/pjrt_plugin.h"

namespace pw::pjrt {

class PjrtShardExecutable final : public Executable {
 public:
  // `device_index` maps each device of this host to its PJRT device index in `client`.
  static absl::StatusOr<ExecutableRef> Compile(std::shared_ptr<const PjrtClient> client,
                                               const StableHloFunctionDef& def, int num_shards,
                                               absl::flat_hash_map<DeviceId, int> device_index);

  const std::string& name() const override { return def_.name; }
  int num_shards() const override { return num_shards_; }
  const std::vector<ArraySpec>& input_specs() const override { return def_.inputs; }
  const std::vector<ArraySpec>& output_specs() const override { return def_.outputs; }
  Future<std::vector<DeviceBufferRef>> ExecuteShard(const ShardLaunch& launch) const override;

 private:
  PjrtShardExecutable(std::shared_ptr<const PjrtClient> client, StableHloFunctionDef def,
                      int num_shards, absl::flat_hash_map<DeviceId, int> device_index,
                      std::unique_ptr<PjrtExecutable> exe)
      : client_(std::move(client)), def_(std::move(def)), num_shards_(num_shards),
        device_index_(std::move(device_index)), exe_(std::move(exe)) {}
  absl::StatusOr<std::shared_ptr<PjrtBuffer>> Stage(const DeviceBufferRef& input, size_t i,
                                                    int device_index, DeviceId device) const;

  const std::shared_ptr<const PjrtClient> client_;
  const StableHloFunctionDef def_;
  const int num_shards_;
  const absl::flat_hash_map<DeviceId, int> device_index_;
  const std::unique_ptr<PjrtExecutable> exe_;
};

}  // namespace pw::pjrt
