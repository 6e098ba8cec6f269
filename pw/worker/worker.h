// Worker: one host's devices, object-store shard and data plane.
//
// Thread-safe. Host-side work (Dispatch) runs on the worker's dispatch thread in arrival order:
// for each node it reserves output memory, creates the output shards in the object store as
// pending futures, looks up (or sets up receives for) inputs, and enqueues the computation on each
// local device. Nothing there waits for data or memory, so a whole subgraph is dispatched before
// any of it runs; the device thread waits for the item's inputs and memory when it reaches it,
// like a stream waiting on events, then launches it; outputs are fulfilled when the executable's
// completion future is ready. Receives (transfer nodes) pull
// source shards from their hosts (FetchShard on the peer) and copy on the data-plane thread.
// A work whose computations all run on launch (native kernels) goes to each device as one item,
// a segment (segments.cc), whose intermediates stay on the device thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "pw/base/mutex.h"
#include "pw/base/countdown.h"
#include "pw/base/work_queue.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/executor/collectives.h"
#include "pw/executor/device.h"
#include "pw/object_store/object_store.h"
#include "pw/pjrt/pjrt_backend.h"
#include "pw/transport/worker_interface.h"

namespace pw {

class Worker final : public WorkerInterface {
 public:
  // Finds a peer worker by host; returns nullptr for unknown hosts.
  using PeerLookup = std::function<WorkerInterface*(HostId)>;

  // `collectives` is the communicator the devices' collective kernels use (shared by every
  // worker of an in-process cluster); it must outlive the worker.
  // `pjrt` runs StableHLO functions (its client is created on first use; null: none); it must
  // cover this host's devices and may be shared with other workers of the process.
  Worker(HostId host, IslandId island, const std::vector<DeviceSpec>& devices,
         Collectives* collectives, PeerLookup peers,
         std::shared_ptr<pjrt::PjrtBackend> pjrt = nullptr);
  // Fails outstanding device work, then drains the dispatch and data-plane threads.
  ~Worker() override;

  HostId host() const override { return host_; }
  absl::Status LoadFunction(FunctionId id, const FunctionDef& def) override;
  DispatchAck Dispatch(HostWork work) override;
  Future<> PutShard(BufferId id, DeviceId device, HostArray shard) override;
  Future<DeviceBufferRef> FetchShard(BufferId id, DeviceId device) override;
  void DeleteBuffers(const std::vector<BufferId>& ids) override;
  void CancelRuns(const std::vector<RunId>& runs, const absl::Status& reason) override;
  void ForgetRuns(const std::vector<RunId>& runs) override;
  // Devices still running a computation of a run cancelled more than `grace` before `now`: a
  // computation the runtime cannot interrupt (an endless XLA while_loop, say). Its process must
  // restart for the device to serve again (pw/server's watchdog does).
  struct Overrun {
    DeviceId device;
    RunId run;
    absl::Duration since_cancel;
    absl::Status why;  // Why the run was cancelled.
  };
  std::vector<Overrun> Overrunning(absl::Time now, absl::Duration grace) const;
  // Works dispatched as segments (the planned path) so far; the rest took the shard path.
  int64_t segment_works() const { return segment_works_.load(std::memory_order_relaxed); }
  absl::Status RemoveDevice(DeviceId device, const absl::Status& reason) override;
  absl::Status RestoreDevice(DeviceId device) override;
  absl::StatusOr<HostStatus> Status() const override;
  // This host's device `id`, or nullptr.
  Device* FindDevice(DeviceId id) const;
  // Counts bytes received over `link` in the ICI or DCN totals of Status(): transfer nodes'
  // copies, and (from pw/server) collective inputs from other processes.
  void CountReceived(LinkClass link, int64_t bytes) {
    (link == LinkClass::kDcn ? dcn_bytes_ : ici_bytes_) += bytes;
  }

 private:
  void RunHostWork(std::shared_ptr<const HostWork> work, Promise<> enqueued, Promise<> done);
  // "run R program 'P' node 'N' on device D", for errors.
  static std::string NodeWhere(const HostWork& work, const NodeWork& node, DeviceId device);
  // `bytes` of `device`'s memory: granted now if they fit (no future), else a reservation to
  // wait for, which also goes to `*pending` (if given) for the device thread to wait on.
  static ObjectStore::Memory ReserveMemory(Device& device, int64_t bytes,
                                           Future<ReservationRef>* pending);
  struct Dispatched;
  struct Dispatching;
  // Each adds its shards to `d->done` and finishes them when they complete.
  void DispatchCompute(const std::shared_ptr<Dispatched>& d, Dispatching& state,
                       const NodeWork& node, const ComputeWork& c,
                       const absl::StatusOr<ExecutableRef>& exe);
  void DispatchTransfer(const HostWork& work, const NodeWork& node, const TransferWork& t,
                        const std::shared_ptr<Countdown>& done);
  // One shard of a compute node, run by whichever step of it runs: RunShard on the device
  // thread, then OnShardOutputs and OnShardComputed (inline for backends that complete before
  // Launch returns, else from the launch's futures), or FailShard.
  struct alignas(64) Shard {  // Its own cache lines: the host's devices run neighbouring shards.
    // Its work (naming the run in errors) and the work's countdown, in the Dispatched that holds
    // the shard: that stays until the countdown completes, which the shard's end (ShardEnd) is
    // part of, so a shard holds no reference of its own.
    const HostWork* host_work = nullptr;
    Countdown* work_done = nullptr;
    const NodeWork* node = nullptr;  // In the work's program.
    const Executable* exe = nullptr;  // Held by the Dispatched.
    int rank = 0;
    DeviceId device;
    absl::InlinedVector<Future<DeviceBufferRef>, 2> inputs;
    absl::InlinedVector<Future<ReservationRef>, 2> memory;  // Those not granted at dispatch.
    absl::InlinedVector<Promise<DeviceBufferRef>, 2> outputs;  // Those not yet handed on.
    // The memory of intermediates handed to this shard's node without the store (see Dispatching)
    // that it reads last: released when the shard ends.
    absl::InlinedVector<ObjectStore::Memory, 1> last_read;
    // The store's intermediates that it reads last: deleted once it has run.
    absl::InlinedVector<BufferId, 1> release;
    // Why it fails once it has run: it ran as a stand-in on zeros, or its launch failed.
    absl::Status failed;
    std::vector<DeviceBufferRef> held;  // Outputs held until the launch is known to be whole.
    bool in_flight = false;  // Counted in in_flight_: it completes through a callback.
    // How it ended, for the work's countdown: set by OnShardComputed or FailShard (unset: it
    // was dropped without running).
    std::optional<absl::Status> ended;
    const HostWork& work() const { return *host_work; }
    const ComputeWork& compute() const { return std::get<ComputeWork>(node->work); }
  };
  // Segments: when every compute node of a work runs on launch (native kernels) and may be
  // skipped shard by shard, each device runs all of its shards of the work as one queue item.
  // Shapes are static, so the range of a host program is planned once (SegmentPlan) and each
  // run's dispatch does only what other parts of the system see: the store's entries of values
  // read outside the segment, their memory, and one reservation for the segment's
  // intermediates (the most bytes they hold at once). The device thread keeps the
  // intermediates in the segment's slots: no shard objects, futures or per-node reservations.
  struct SegmentPlan;
  struct Segment;
  struct SegmentEnd {
    void operator()(Segment* segment) const;
  };
  using SegmentPtr = std::unique_ptr<Segment, SegmentEnd>;
  // The plan of the work's range of its program (cached), or null where segments do not apply.
  std::shared_ptr<const SegmentPlan> PlanOf(const HostWork& work);
  std::shared_ptr<const SegmentPlan> MakePlan(const HostWork& work);
  void DispatchSegments(std::shared_ptr<const HostWork> work,
                        std::shared_ptr<const SegmentPlan> plan, Promise<> enqueued,
                        Promise<> done);
  // On the device thread: runs the segment's steps in order.
  void RunSegment(Segment& segment, absl::Status health);
  // Ends a shard: drops what it holds, then counts it done in its work (which may free it).
  struct ShardEnd {
    void operator()(Shard* shard) const;
  };
  using ShardPtr = std::unique_ptr<Shard, ShardEnd>;
  // On the device thread: waits for memory and inputs, then launches (or fails) the shard.
  void RunShard(ShardPtr shard, absl::Status health);
  void OnShardOutputs(ShardPtr shard,
                      const absl::StatusOr<std::vector<DeviceBufferRef>>& outputs,
                      Future<> computed);
  // Counts a launched shard in in_flight_ (once) before it waits for a completion callback.
  void CountInFlight(Shard& shard);
  // Ends a launched shard (and its count in in_flight_): hands on or fails its outputs.
  void OnShardComputed(ShardPtr shard, absl::Status computed);
  // Fails the shard's remaining outputs and its launch's collectives, naming where.
  void FailShard(ShardPtr shard, const absl::Status& status);
  absl::StatusOr<ExecutableRef> LoadExecutable(FunctionId id,
                                               absl::Span<const DeviceId> slice_devices);
  // Why `run` was cancelled (counting one more shard not run), or OK.
  absl::Status Cancelled(RunId run);
  // Waits on the device thread for `f` (an input, memory), or until `run` is cancelled: a
  // cancelled run's shard does not hold its device waiting for what may never come. Returns the
  // cancellation, or OK once `f` is ready (its value is the caller's to read).
  template <typename F>
  absl::Status AwaitUnlessCancelled(const F& f, RunId run) {
    while (!f.IsReady()) {
      if (f.AwaitFor(kCancelPoll)) break;
      if (absl::Status c = Cancelled(run); !c.ok()) return c;
    }
    return absl::OkStatus();
  }
  static constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);
  // Registers a failed shard so consumers see `error` too.
  void PutFailed(BufferId id, DeviceId device, const absl::Status& error);

  const HostId host_;
  const IslandId island_;
  Collectives* const collectives_;
  const PeerLookup peers_;
  pw::Mutex fn_mu_;
  const std::shared_ptr<pjrt::PjrtBackend> pjrt_;
  absl::flat_hash_map<FunctionId, FunctionDef> functions_ ABSL_GUARDED_BY(fn_mu_);
  // Keyed by function and slice shape; SPMD XLA functions by function and slice devices.
  using ExecutableKey = std::tuple<FunctionId, int, std::vector<DeviceId>>;
  absl::flat_hash_map<ExecutableKey, ExecutableRef> executables_ ABSL_GUARDED_BY(fn_mu_);
  // After the PJRT client and executables: shards (possibly PJRT buffers) are destroyed first.
  ObjectStore store_;
  mutable pw::Mutex cancel_mu_;
  struct CancelledRun {
    absl::Status why;
    absl::Time at;
  };
  absl::flat_hash_map<RunId, CancelledRun> cancelled_ ABSL_GUARDED_BY(cancel_mu_);
  std::atomic<size_t> num_cancelled_{0};  // cancelled_.size(), read without the lock.
  std::atomic<int64_t> cancelled_shards_{0};
  std::atomic<int64_t> segment_works_{0};
  std::atomic<int64_t> ici_bytes_{0};
  std::atomic<int64_t> dcn_bytes_{0};
  WorkQueue data_plane_;
  // Launched shards waiting for a completion callback (which uses the store) that has not run
  // yet; shards that complete on the device thread are not counted (the devices go first).
  // Destroyed after the devices (no new launches) and before the store: waits for them.
  struct InFlight {
    std::atomic<int64_t> count{0};
    ~InFlight() {
      while (count.load(std::memory_order_acquire) > 0) absl::SleepFor(absl::Microseconds(100));
    }
  } in_flight_;
  // Plans by host program and range. Used on the dispatch thread only.
  struct PlanKey {
    const HostProgram* program;
    size_t begin, end;
    template <typename H>
    friend H AbslHashValue(H h, const PlanKey& k) {
      return H::combine(std::move(h), k.program, k.begin, k.end);
    }
    friend bool operator==(const PlanKey&, const PlanKey&) = default;
  };
  absl::flat_hash_map<PlanKey, std::shared_ptr<const SegmentPlan>> plans_;
  absl::flat_hash_map<DeviceId, std::unique_ptr<Device>> devices_;  // Fixed at construction.
  WorkQueue dispatch_;  // Last: destroyed (drained) first.
};

}  // namespace pw
