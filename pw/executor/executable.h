// Executable: a compiled function loaded for a slice shape, run SPMD on every device of a slice.
//
// Thread-safe and immutable: one Executable serves every slice of its shape and every launch.
// Shapes are static: input and output specs are per shard and known before anything runs, which is
// what lets dispatch allocate outputs and set up receives ahead of execution.
//
// Backends: the native host-kernel backend (native_function.h). A PJRT backend implements the
// same interface with buffers it owns and completion events as the returned future.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/base/shape.h"
#include "pw/executor/collectives.h"
#include "pw/executor/device_buffer.h"

namespace pw {

// Everything one device needs to run its shard of one launch.
struct ShardLaunch {
  CollectiveKey key;                  // `op` is set by the executable per collective.
  int rank = 0;                       // This device's position in the slice.
  absl::Span<const DeviceId> slice_devices;  // Physical devices of the slice, in rank order.
  DeviceId device;
  absl::InlinedVector<DeviceBufferRef, 2> inputs;  // Ready buffers, one per input spec.
  Collectives* collectives = nullptr;
};

class Executable {
 public:
  virtual ~Executable() = default;
  virtual const std::string& name() const = 0;
  // Number of shards (devices) this executable was loaded for.
  virtual int num_shards() const = 0;
  virtual const std::vector<ArraySpec>& input_specs() const = 0;
  virtual const std::vector<ArraySpec>& output_specs() const = 0;
  // Bytes of intermediate values one shard holds while it runs, beyond its inputs and outputs
  // (native kernels: every op's result that is not an output; XLA's temporaries are its own
  // allocator's: 0). Allocated outside the device's budget, as a compiler's temporaries are,
  // but a function whose temporaries exceed a device's memory is refused there.
  virtual int64_t temp_bytes() const { return 0; }
  // Runs one shard. The future holds the outputs once they are computed; errors name the
  // function and, where it applies, the op.
  virtual Future<std::vector<DeviceBufferRef>> ExecuteShard(const ShardLaunch& launch) const = 0;

  // One shard's launch as the runtime sees it: `outputs` is ready once the output buffers exist,
  // which for a backend with its own streams (PJRT) is when the computation is enqueued, before
  // it has run: consumers on that backend enqueue behind it, and reading the buffers waits for the
  // data (and reports the computation's error). `computed` is ready when it has run. A launch
  // that has run before returning (native kernels) sets `ran` instead, and leaves both futures
  // invalid.
  struct Run {
    Future<std::vector<DeviceBufferRef>> outputs;
    Future<> computed;
    std::optional<absl::StatusOr<std::vector<DeviceBufferRef>>> ran;
  };
  // A shard of a launch that fails before it runs here (an input, its memory or its device
  // failed, its run was cancelled), after the runtime has failed the launch in its Collectives.
  // A backend whose shards meet in a rendezvous inside it that the runtime cannot abort (an SPMD
  // module's partitions in XLA's collectives) runs it anyway, on zeros, so the peers complete; the
  // peers then fail their results (they see the launch's failure). Others do nothing. `launch`
  // has no inputs.
  virtual void RunStandIn(const ShardLaunch& launch) const {}
  virtual Run Launch(const ShardLaunch& launch) const {
    Future<std::vector<DeviceBufferRef>> f = ExecuteShard(launch);
    if (f.IsReady()) return {.ran = f.Await()};
    return {f, AsStatusFuture(f)};
  }
};

using ExecutableRef = std::shared_ptr<const Executable>;

}  // namespace pw
