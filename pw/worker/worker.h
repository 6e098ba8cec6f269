// Worker: one host's devices, object-store shard and data plane.
//
// Thread-safe. Host-side work (Dispatch) runs on the worker's dispatch thread in arrival order.
// Every work, whatever its backends, takes one path (segments.cc): its range of the host program is
// planned once, and each run's dispatch creates the output shards in the object store as pending
// futures, looks up (or sets up receives for) the inputs, reserves memory and enqueues one item,
// a segment, per local device. Nothing there waits for data, memory or a compile, so a whole
// subgraph is dispatched before any of it runs; the device thread waits for each step's compiled
// executable, inputs and memory when it reaches it, like a stream waiting on events, then launches
// it, keeping intermediates in the segment's slots. Receives (transfer nodes) pull source shards
// from their hosts (FetchShard on the peer) and copy on the data-plane thread. XLA modules compile
// on the compile thread, never on the dispatch thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "pw/base/mutex.h"
#include "pw/base/countdown.h"
#include "pw/base/work_queue.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/executor/collectives.h"
#include "pw/executor/device.h"
#include "pw/object_store/object_store.h"
#include "pw/pjrt/pjrt_backend.h"
#include "pw/trace/trace.h"
#include "pw/transport/worker_interface.h"
#include "pw/worker/client_time.h"

namespace pw {

class Worker final : public WorkerInterface {
 public:
  // Finds a peer worker by host; returns nullptr for unknown hosts.
  using PeerLookup = std::function<WorkerInterface*(HostId)>;

  // `collectives` is the communicator the devices' collective kernels use (the host's own,
  // reaching other hosts through its CollectivePeers); it must outlive the worker.
  // `pjrt` runs StableHLO functions (its client is created on first use; null: none); it must
  // cover this host's devices.
  Worker(HostId host, IslandId island, const std::vector<DeviceSpec>& devices,
         Collectives* collectives, PeerLookup peers,
         std::shared_ptr<pjrt::PjrtBackend> pjrt = nullptr);
  // Fails outstanding device work (Fail), then drains the dispatch and data-plane threads.
  ~Worker() override;

  HostId host() const override { return host_; }
  // A per-shard XLA module compiles on the compile thread; the future is ready once it has.
  Future<> LoadFunction(FunctionId id, const FunctionDef& def) override;
  DispatchAck Dispatch(HostWork work) override;
  Future<> PutShard(BufferId id, DeviceId device, HostArray shard) override;
  Future<DeviceBufferRef> FetchShard(BufferId id, DeviceId device) override;
  // In process: Unimplemented (a client here puts and fetches through the controller).
  UploadAck ExpectUpload(BufferId id, DeviceId device, const ArraySpec& spec) override;
  Future<ShardTransfer> OfferShard(BufferId id, DeviceId device) override;
  // On the host's I/O thread (pw-io<host>), so neither dispatch nor transfers wait for a disk.
  Future<> SaveShard(BufferId id, DeviceId device, const ShardFile& file) override;
  Future<> LoadShard(BufferId id, DeviceId device, const ArraySpec& spec,
                     const ShardFile& file) override;
  // A shard whose buffer comes later (a client's upload into it, pw/rpc/worker_service.h): the
  // shard exists now for work queued after this call, and is ready once `buffer` is (and device
  // memory is reserved); `buffer` failing, or not of `spec` on `device`, fails it. A shard
  // larger than the device's memory fails at once (the returned future is ready).
  Future<> PutShardLater(BufferId id, DeviceId device, const ArraySpec& spec,
                         Future<DeviceBufferRef> buffer);
  void DeleteBuffers(const std::vector<BufferId>& ids) override;
  void Unload(const std::vector<FunctionId>& functions,
              const std::vector<uint64_t>& host_programs) override;
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
  // The PJRT backend this worker runs StableHLO functions on (null: none).
  const std::shared_ptr<pjrt::PjrtBackend>& pjrt_backend() const { return pjrt_; }
  // The host has failed, as a killed worker process (EmbeddedCluster::FailHost): every device
  // is removed with `why` (queued and later work fails, its collectives are aborted) and the
  // object store is closed (shards dropped; peers waiting for one, and later fetches, get `why`).
  // The worker object stays valid; it serves nothing from then on.
  void Fail(const absl::Status& why);
  // In process, these answer at once.
  Future<> RemoveDevice(DeviceId device, const absl::Status& reason) override;
  Future<> RestoreDevice(DeviceId device) override;
  Future<HostStatus> Status() const override;
  // This host's device `id`, or nullptr.
  Device* FindDevice(DeviceId id) const;
  // Tests: the clock device time is read on (nanoseconds; default trace::Now). Set before any
  // Dispatch.
  void SetClockForTesting(std::function<int64_t()> clock) { clock_ = std::move(clock); }
  // Counts bytes received over `link` in the ICI or DCN totals of Status(): `logical`, the bytes
  // a transfer node wrote into its shards (or a collective's inputs); `wire`, the bytes that
  // crossed from another process for them (whole source shards fetched from remote peers; none
  // in process). From pw/server: collective inputs from other processes, both.
  void CountReceived(LinkClass link, int64_t logical, int64_t wire) {
    (link == LinkClass::kDcn ? dcn_bytes_ : ici_bytes_) += logical;
    (link == LinkClass::kDcn ? dcn_wire_bytes_ : ici_wire_bytes_) += wire;
  }

 private:
  // A shard of buffer `id` on `device` in the making: stored (its future is `made`'s), with
  // `bytes` of the device's memory reserved for it.
  struct NewShard {
    Promise<DeviceBufferRef> made;
    Future<ReservationRef> memory;
  };
  // Stores a new shard, or says why not (no such device, a failed device, an id in use, a shard
  // the device can never hold).
  absl::StatusOr<NewShard> StoreNewShard(BufferId id, DeviceId device, int64_t bytes);
  // "run R program 'P' node 'N' on device D", for errors.
  static std::string NodeWhere(const HostWork& work, const NodeWork& node, DeviceId device);
  // `bytes` of `device`'s memory: granted now if they fit (no future), else a reservation to
  // wait for, which also goes to `*pending` (if given) for the device thread to wait on.
  static ObjectStore::Memory ReserveMemory(Device& device, int64_t bytes,
                                           Future<ReservationRef>* pending);
  // A source shard of a transfer, fetched: its buffer, and whether it comes from another process.
  struct Fetched {
    Future<DeviceBufferRef> shard;
    bool remote;
  };
  // Fetches the source shards `ranks` (distinct) of transfer `t`'s buffer `src`, each once, a
  // host's together (FetchShards: one message each way to a remote host). Keyed by rank.
  absl::flat_hash_map<int, Fetched> FetchSources(const TransferWork& t, BufferId src,
                                                 const std::vector<int>& ranks);
  // `traced`: the dispatch's trace span is recording (each shard's copy is a span of the host's
  // transfers track, ending the dispatch's flow to it).
  void DispatchTransfer(const HostWork& work, const NodeWork& node, const TransferWork& t,
                        const std::shared_ptr<Countdown>& done, bool traced);
  // Segments: each device runs all of its shards of a work as one queue item. Shapes are static,
  // so the range of a host program is planned once (SegmentPlan) and each run's dispatch does
  // only what other parts of the system see: the store's entries of values read outside the
  // segment, their memory, and one reservation for the segment's intermediates (the most bytes
  // they hold at once). The device thread keeps the intermediates in the segment's slots: no
  // per-shard objects, futures or reservations.
  struct SegmentPlan;
  struct Segment;
  struct SegmentEnd {
    void operator()(Segment* segment) const;
  };
  using SegmentPtr = std::unique_ptr<Segment, SegmentEnd>;
  // The plan of the work's range of its program (cached).
  std::shared_ptr<const SegmentPlan> PlanOf(const HostWork& work);
  std::shared_ptr<const SegmentPlan> MakePlan(const HostWork& work);
  // On the dispatch thread: drops the plans of `programs` and of programs that have gone.
  void DropPlans(const absl::flat_hash_set<uint64_t>& programs);
  void DispatchSegments(std::shared_ptr<const HostWork> work, Promise<absl::Time> enqueued,
                        Promise<int64_t> done);
  // On the device thread: runs the segment's steps in order.
  void RunSegment(Segment& segment, absl::Status health);
  // A function's executable for a slice as dispatch plans with it. Native kernels compile at
  // once (cheaply); StableHLO modules on the compile thread (a per-shard module was compiled at
  // registration and is found in the backend's cache), so neither the dispatch thread nor a lock
  // it takes ever waits for XLA; the device thread waits for `exe` when it reaches the step.
  // `outputs`: per-shard output specs, known from the definition before it compiles.
  // `temp_bytes`: its intermediate values (Executable::temp_bytes): more than a device has fails
  // the step there.
  struct Loaded {
    Future<ExecutableRef> exe;
    std::vector<ArraySpec> outputs;
    int64_t temp_bytes = 0;
  };
  absl::StatusOr<Loaded> LoadExecutable(FunctionId id, absl::Span<const DeviceId> slice_devices);
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
  mutable pw::Mutex fn_mu_;
  const std::shared_ptr<pjrt::PjrtBackend> pjrt_;
  absl::flat_hash_map<FunctionId, FunctionDef> functions_ ABSL_GUARDED_BY(fn_mu_);
  // Per-shard XLA modules compiled at LoadFunction, held so the backend's cache (which holds
  // executables only while someone uses them) keeps them for the first run.
  absl::flat_hash_map<FunctionId, std::shared_ptr<const pjrt::PjrtExecutable>> precompiled_
      ABSL_GUARDED_BY(fn_mu_);
  // Keyed by function and slice shape; SPMD XLA functions by function and slice devices. Each
  // key compiles once (its first caller posts the compile; later ones share its future); a
  // compile error stays, as compiling the same module for the same devices fails the same way.
  using ExecutableKey = std::tuple<FunctionId, int, std::vector<DeviceId>>;
  absl::flat_hash_map<ExecutableKey, Loaded> executables_ ABSL_GUARDED_BY(fn_mu_);
  std::atomic<int64_t> checkpoint_saved_{0}, checkpoint_loaded_{0};  // Bytes (HostStatus).
  // Checkpoint reads and writes (SaveShard, LoadShard). Before the store: a shard's callback
  // that posts here as the store goes finds it; after the counters its jobs add to.
  WorkQueue io_;
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
  std::atomic<int64_t> ici_bytes_{0};
  std::atomic<int64_t> dcn_bytes_{0};
  std::atomic<int64_t> ici_wire_bytes_{0};
  std::atomic<int64_t> dcn_wire_bytes_{0};
  WorkQueue data_plane_;
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
  std::atomic<size_t> num_plans_{0};  // plans_.size(), for Status.
  std::atomic<int64_t> compiles_{0}, compile_ns_{0}, executable_hits_{0};
  std::function<int64_t()> clock_ = [] { return trace::Now(); };  // Device time's.
  ClientTime client_time_;  // HostStatus::client_device_ns, timed per launch.
  absl::flat_hash_map<DeviceId, std::unique_ptr<Device>> devices_;  // Fixed at construction.
  WorkQueue compile_;   // XLA compiles (drained before the devices go).
  WorkQueue dispatch_;  // Last: destroyed (drained) first.
};

}  // namespace pw
