// WorkerInterface: what the controller and peer workers ask of one host's worker.
//
// Implemented in-process by Worker (pw/worker) and, over a wire, by a remote stub. All methods are
// thread-safe and non-blocking: results come back as futures.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "pw/base/future.h"
#include "pw/base/host_array.h"
#include "pw/base/ids.h"
#include "pw/executor/device_buffer.h"
#include "pw/executor/function_def.h"
#include "pw/transport/messages.h"

namespace pw {

class WorkerInterface {
 public:
  virtual ~WorkerInterface() = default;
  virtual HostId host() const = 0;
  // Whether this worker is reached through a wire transport (another process, or a gRPC service):
  // shards fetched from it move over the data plane (counted as wire bytes, HostStatus).
  virtual bool remote() const { return false; }
  // Makes a function known to this host; it is compiled per slice shape on first use.
  virtual Future<> LoadFunction(FunctionId id, const FunctionDef& def) = 0;
  // Queues host-side work; work of successive calls reaches each device in call order.
  virtual DispatchAck Dispatch(HostWork work) = 0;
  // Stores one shard from host memory (waits for device memory if it is full).
  virtual Future<> PutShard(BufferId id, DeviceId device, HostArray shard) = 0;
  // One shard's buffer once it is ready (the data plane's read side). A shard whose producing
  // dispatch has not reached this host yet is waited for.
  virtual Future<DeviceBufferRef> FetchShard(BufferId id, DeviceId device) = 0;
  // Several shards of buffer `id`, as FetchShard each (in `devices`' order). A remote worker
  // asks for them in one message and answers them together, once all are ready: the shards of
  // one buffer are made by one SPMD computation, so they are ready at about the same time.
  virtual std::vector<Future<DeviceBufferRef>> FetchShards(BufferId id,
                                                           const std::vector<DeviceId>& devices) {
    std::vector<Future<DeviceBufferRef>> shards;
    shards.reserve(devices.size());
    for (DeviceId d : devices) shards.push_back(FetchShard(id, d));
    return shards;
  }
  // Client I/O beside the controller. ExpectUpload: a client sends shard `spec` of buffer `id`
  // to this host's data plane itself; the shard exists from now on for work queued after this
  // call and is ready once its bytes are stored (UploadAck). OfferShard: the shard, once ready,
  // is held for a client to read there (until read or the host's client transfer timeout).
  // The transfer's `rank` is left 0 for the caller to set. A host whose data plane clients cannot
  // reach (in process) answers Unimplemented: its clients go through the controller.
  virtual UploadAck ExpectUpload(BufferId id, DeviceId device, const ArraySpec& spec) = 0;
  virtual Future<ShardTransfer> OfferShard(BufferId id, DeviceId device) = 0;
  virtual void DeleteBuffers(const std::vector<BufferId>& ids) = 0;
  // Checkpoints, written and read by the workers (pw/checkpoint). SaveShard: the shard, once
  // ready, is written as the chunk of `file` at its region (the array's directory exists). An
  // error names the host, the shard and the file. LoadShard: the shard of `spec` (the region's)
  // exists from now on for work queued after this call, and is ready once read from the chunks
  // of `file`'s array that overlap its region (any chunk shape; raw or zstd); an array that is
  // not `file.global` fails it. The paths are the controller's to check.
  virtual Future<> SaveShard(BufferId id, DeviceId device, const ShardFile& file) = 0;
  virtual Future<> LoadShard(BufferId id, DeviceId device, const ArraySpec& spec,
                             const ShardFile& file) = 0;
  // Forgets what a disconnected client left on this host: its functions (definitions and
  // compiled executables) and its host programs (HostProgram::id; bodies and plans). Work for
  // them dispatched later fails as never loaded. Ordered with Dispatch like DeleteBuffers.
  virtual void Unload(const std::vector<FunctionId>& functions,
                      const std::vector<uint64_t>& host_programs) = 0;
  // The runs' work on this host that has not launched yet (including work dispatched later)
  // fails with `reason` instead of running; collectives it would join are failed for the other
  // shards. Already launched computations finish. Ordered with Dispatch like DeleteBuffers.
  virtual void CancelRuns(const std::vector<RunId>& runs, const absl::Status& reason) = 0;
  // The runs (cancelled or failed) have ended everywhere: drops their cancellation and
  // collective failure records.
  virtual void ForgetRuns(const std::vector<RunId>& runs) = 0;
  // Told for every device of the cluster: the owner fails the device's work, every worker aborts
  // its collectives that include the device.
  virtual Future<> RemoveDevice(DeviceId device, const absl::Status& reason) = 0;
  // A removed device is back in service (its host's worker rejoined).
  virtual Future<> RestoreDevice(DeviceId device) = 0;
  // An error (naming the host) when the host cannot be asked.
  virtual Future<HostStatus> Status() const = 0;
};

}  // namespace pw
