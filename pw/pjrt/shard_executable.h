// PjrtShardExecutable: a StableHLO function as a runtime Executable, run shard by shard on the
// devices of a slice through a PJRT backend (one PJRT device per runtime device).
//
// Two kinds of module (StableHloFunctionDef::num_partitions):
// - per-shard (1): compiled once per function as a portable executable that runs on whichever
//   PJRT device backs the shard's device;
// - SPMD (N = slice size): one module of N partitions with collectives inside (jax.shard_map,
//   pmap-style: partition i holds shard i as a [1, ...] block), compiled once per slice with
//   partition i placed on the slice's i-th device. Each device executor launches its own partition
//   (launch id derived from the run and node), and the partitions meet in XLA's collectives. All
//   of the slice's devices must belong to the same PJRT backend (one process: the CPU plugin has
//   no multi-process collectives); otherwise compiling fails, naming the device. A partition
//   whose launch another partition failed (Collectives::LaunchFailure, read once it has run)
//   fails its outputs: they were computed with a stand-in's zeros (RunStandIn).
// Inputs that are not already PJRT buffers of the right shape on that device (native kernels'
// outputs, put arrays) are staged through host memory, once per buffer (the staged copy is kept
// as the buffer's mirror). Outputs are PJRT buffers owned by the plugin, handed on as soon as the
// computation is enqueued (Launch), so chains of XLA computations queue up inside PJRT; the
// PJRT execution event is their completion. (The CPU plugin runs synchronously: a computation
// with ready inputs runs on the device executor's thread, and Launch returns once it has run.)
//
// Thread-safe and immutable.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pw/executor/executable.h"
#include "pw/executor/function_def.h"
#include "pw/pjrt/pjrt_backend.h"

namespace pw::pjrt {

class PjrtShardExecutable final : public Executable {
 public:
  // `slice_devices` are the slice's devices in rank order.
  static absl::StatusOr<ExecutableRef> Compile(std::shared_ptr<PjrtBackend> backend,
                                               const StableHloFunctionDef& def,
                                               absl::Span<const DeviceId> slice_devices);
  // Compiles a per-shard module (num_partitions 1) into the backend's cache ahead of its first
  // Compile, which then finds it there while the caller holds the result. Errors name the
  // function.
  static absl::StatusOr<std::shared_ptr<const PjrtExecutable>> Precompile(
      const std::shared_ptr<PjrtBackend>& backend, const StableHloFunctionDef& def);

  const std::string& name() const override { return def_.name; }
  int num_shards() const override { return num_shards_; }
  const std::vector<ArraySpec>& input_specs() const override { return def_.inputs; }
  const std::vector<ArraySpec>& output_specs() const override { return def_.outputs; }
  Future<std::vector<DeviceBufferRef>> ExecuteShard(const ShardLaunch& launch) const override;
  // Outputs as soon as the partition is enqueued on its PJRT device.
  Run Launch(const ShardLaunch& launch) const override;
  // An SPMD partition that will not run for real still launches, on zeros, and waits to have
  // run, so its peers inside XLA's collectives complete (XLA would end the process otherwise).
  void RunStandIn(const ShardLaunch& launch) const override;

 private:
  PjrtShardExecutable(std::shared_ptr<PjrtBackend> backend,
                      std::shared_ptr<const PjrtClient> client, StableHloFunctionDef def,
                      int num_shards, std::vector<ArraySpec> pjrt_inputs,
                      std::shared_ptr<const PjrtExecutable> exe);
  absl::StatusOr<std::shared_ptr<PjrtBuffer>> Stage(const DeviceBufferRef& input, size_t i,
                                                    int device_index, DeviceId device) const;

  const std::shared_ptr<PjrtBackend> backend_;
  const std::shared_ptr<const PjrtClient> client_;
  const StableHloFunctionDef def_;
  const int num_shards_;
  const std::vector<ArraySpec> pjrt_inputs_;  // Per-partition PJRT shapes of the inputs.
  const std::shared_ptr<const PjrtExecutable> exe_;
  // StagingKey of input i on PJRT device d: staging_keys_[i][d].
  std::vector<std::vector<const void*>> staging_keys_;
};

}  // namespace pw::pjrt
