// Controller: the single controller. Owns the resource manager, one gang scheduler per island,
// the registry of functions and programs, and the table of logical buffers.
//
// Thread-safe. Implements ControllerInterface for clients. Submit validates and lowers a program
// (once per argument layout; the plan is cached), allocates every output and intermediate buffer,
// splits the sharded dataflow graph into one subgraph per island and one message per host, and
// hands each island's subgraph to its scheduler as one request. Run completion (on the
// controller's own thread) unpins buffers and frees the unreferenced ones on their hosts.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "pw/base/mutex.h"
#include "pw/base/work_queue.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/controller/client_registry.h"
#include "pw/controller/membership.h"
#include "pw/controller/output_ids.h"
#include "pw/controller/program_cache.h"
#include "pw/controller/run_manager.h"
#include "pw/controller/share_table.h"
#include "pw/object_store/buffer_table.h"
#include "pw/program/lowering.h"
#include "pw/resource_manager/resource_manager.h"
#include "pw/scheduler/island_scheduler.h"
#include "pw/transport/controller_interface.h"
#include "pw/transport/worker_interface.h"

namespace pw {

class Controller final : public ControllerInterface {
 public:
  struct Options {
    // Every host's worker runs in this process (the embedded cluster): a checkpoint path may be
    // absolute without a checkpoint root. (Loading, placement and failures are the same in both
    // modes.)
    bool hosts_share_process = true;
    // The timeout of a run submitted without one (RunOptions::timeout); zero: none.
    absl::Duration default_run_timeout = absl::ZeroDuration();
    // The most nodes a registered program may have (pw controller --max-program-nodes): its
    // plans, host programs and per-run state grow with them.
    int64_t max_program_nodes = int64_t{1} << 20;
    // What one client may have registered at once (functions and programs stay until it
    // leaves): past any of these, a registration is refused with ResourceExhausted naming the
    // flag, and the client's others are unaffected. pw controller --max-client-functions,
    // --max-client-function-bytes (their definitions' bytes, DefinitionBytes),
    // --max-client-programs. Each at least 1.
    struct Definitions {
      int64_t max_functions = 16384;
      int64_t max_function_bytes = int64_t{1} << 30;
      int64_t max_programs = 16384;
    };
    Definitions definitions;
    // The most bytes (every shard, replicas included) of arrays one client may hold on the
    // cluster at once: its puts and the buffers its runs produce (pw controller
    // --max-client-bytes). A put or run past it is refused with ResourceExhausted. 0: no quota.
    int64_t max_client_bytes = 0;
    // The islands' gang scheduling (pw/scheduler): "share" (proportional share among tenants)
    // or "fifo"; and the estimated device time each keeps in flight per device.
    struct Scheduling {
      std::string policy = "share";
      absl::Duration window = absl::Milliseconds(2);
    };
    Scheduling scheduling;
    // The directory checkpoints are written under and read from (SaveArray, LoadArray,
    // CommitCheckpoint); clients name paths within it. Empty: any absolute path (an embedded
    // cluster, which runs as its one user; a process cluster without one refuses checkpoints);
    // pw up's default is <state dir>/checkpoints.
    std::string checkpoint_root;
    // Called as each run finishes (on the controller's completion thread; must not block):
    // the time from its submission, and its outcome. Metrics observe runs through it.
    std::function<void(absl::Duration, const absl::Status&)> on_run_done;
    // Told each enqueued run's dispatch overhead: submission to enqueued on every device (told
    // before the run's end).
    std::function<void(absl::Duration)> on_run_enqueued;
    // The worker processes' trace recorders (pw/server): started with each trace, and their
    // events (on this process's clock) collected at its end. Unset for an embedded cluster,
    // whose workers record into this process's recorder.
    std::function<void()> start_remote_traces;
    std::function<Future<trace::Chunk>()> stop_remote_traces;
  };
  explicit Controller(const ClusterSpec& spec) : Controller(spec, Options()) {}
  Controller(const ClusterSpec& spec, Options options);
  // Waits for runs in flight, then stops the schedulers.
  ~Controller() override;

  // --- Cluster membership: the embedded cluster and the process cluster's worker registration
  // and failure monitor (pw/server) call these, so a host joins and fails the same way in both.
  // `host` (known to the resource manager) serves through `worker`: the other workers take its
  // devices back (their collectives), the worker is attached and loads the functions that were
  // loaded on that host before (a rejoining worker is a fresh process), and then its devices are
  // in service again. Returns when that is done; if a load fails, the host fails again
  // (FailHost) and the error is returned.
  absl::Status JoinHost(HostId host, IslandId island, WorkerInterface* worker);
  // `host`'s worker has failed (its process died or stopped answering, a new one registered for
  // the host, or EmbeddedCluster::FailHost). The caller has failed the worker's own outstanding
  // work. Arrays with a shard there are lost: reading one, or passing it to a run, fails with
  // DataLoss naming it and the host (BufferTable::LoseHost). It is detached (work for the host
  // fails as Unavailable, work submitted before now even once a new worker has joined for it:
  // IslandWork::membership; the worker object must stay alive, as work in flight may hold it),
  // then each of its devices leaves service with the reason "host:H failed: <reason>"
  // (RemoveDevice: the other workers abort their collectives that wait on it).
  void FailHost(HostId host, const std::string& reason);
  ResourceManager& resource_manager() { return rm_; }
  // Takes a device out of service: new programs on its slices fail naming it at once; every
  // worker is told in parallel (work queued on the device fails, collectives that include it are
  // aborted). The future is the device's own worker's answer.
  Future<> RemoveDevice(DeviceId device, const std::string& reason);
  // Blocks until no run is in flight.
  void WaitIdle();
  // Cancels a run in flight (an admin's `pw cancel`, a timeout): what has not launched fails
  // with `why`, its collectives are aborted, and its client sees `why` at once. A computation
  // already running is left to its worker, which restarts if it overruns (pw/server).
  // NotFound if the run is not in flight.
  absl::Status CancelRun(RunId run, const absl::Status& why);
  // Functions and programs registered and not yet freed (a client's go when it disconnects).
  // And what else the controller keeps per client, for leak checks: each is 0 once every
  // client has left and every run has ended.
  struct Registry {
    size_t functions = 0, programs = 0, plans = 0, signatures = 0, runs = 0, traces = 0,
           clients = 0, tenants = 0;
  };
  Registry registry() const;
  // Cancels every run of `client` in flight; returns them.
  std::vector<RunId> CancelClientRuns(ClientId client, const absl::Status& why);

  // --- ControllerInterface.
  using ControllerInterface::Connect;
  absl::StatusOr<ClientId> Connect(const std::string& name, const ConnectOptions& options) override;
  absl::Status SetTenant(const TenantSettings& settings) override;
  absl::Status Disconnect(ClientId client) override;
  absl::StatusOr<SliceInfo> AllocateSlice(ClientId client, const SliceRequest& request) override;
  absl::Status ReleaseSlice(ClientId client, SliceId slice) override;
  absl::StatusOr<FunctionInfo> RegisterFunction(ClientId client,
                                                const FunctionDef& def) override;
  absl::StatusOr<std::vector<ArraySpec>> LoadFunction(ClientId client, FunctionId function,
                                                      SliceId slice) override;
  absl::StatusOr<ProgramId> RegisterProgram(ClientId client, const ProgramIr& ir) override;
  absl::StatusOr<std::string> ExplainProgram(ClientId client, ProgramId program) override;
  absl::StatusOr<BufferId> ReserveBufferIds(ClientId client, int64_t count) override;
  Future<RunInfo> Submit(ClientId client, ProgramId program, const std::vector<BufferId>& args,
                         const RunOptions& options) override;
  absl::StatusOr<ArrayInfo> PutArray(ClientId client, SliceId slice, const Sharding& sharding,
                                     HostArray value) override;
  Future<HostArray> FetchArray(ClientId client, BufferId id) override;
  Future<> ArrayReady(ClientId client, BufferId id) override;
  Future<DirectPut> BeginPut(ClientId client, SliceId slice, const Sharding& sharding,
                             const ArraySpec& spec) override;
  Future<LocatedArray> LocateArray(ClientId client, BufferId id, bool inline_only) override;
  absl::Status ReleaseArray(ClientId client, BufferId id) override;
  Future<> SaveArray(ClientId client, BufferId id, const std::string& path) override;
  absl::StatusOr<ArrayInfo> LoadArray(ClientId client, SliceId slice, const Sharding& sharding,
                                      const ArraySpec& spec, const std::string& path) override;
  absl::StatusOr<std::string> CommitCheckpoint(
      ClientId client, const std::string& path,
      const std::vector<std::pair<std::string, std::string>>& files,
      const std::string& final_path) override;
  absl::StatusOr<std::string> ShareArray(ClientId client, BufferId id,
                                         const ShareOptions& options) override;
  absl::StatusOr<ArrayInfo> ImportArray(ClientId client, const std::string& token) override;
  absl::Status RevokeShare(ClientId client, const std::string& token) override;
  absl::StatusOr<ClusterStatus> Status() override;
  absl::StatusOr<int64_t> StartTrace(ClientId client) override;
  Future<trace::Chunk> StopTrace(ClientId client, bool all_tenants) override;
  // Clients connected now (with those leaving whose last call has not ended).
  size_t num_clients() const;

 private:
  struct Function {
    ClientId owner;
    FunctionDef def;
    // Hosts it is bound on (its slices' hosts): loaded there, or loaded when the host's worker
    // joins. A function is loaded only where it is bound, so binding one waits on no other
    // island's workers.
    absl::flat_hash_set<HostId> loaded_on;
  };
  // Loads `function` on each of `hosts` that has not loaded it (unlocked; mu_ only to read and
  // record); a host whose worker has not joined loads it when it joins.
  absl::Status LoadOnHosts(FunctionId function, const std::vector<HostId>& hosts);
  // What a plan needs of a function: loaded on the hosts of its node's slice, where binding it
  // (LoadFunction) loaded it (nothing that waits for a worker runs in Submit), else
  // FailedPrecondition naming the host.
  absl::Status EnsureLoadedOn(FunctionId function, const std::vector<HostId>& hosts);
  struct Plan;
  // A program's plans are kept for its last kMaxPlansPerProgram argument layouts.
  static constexpr size_t kMaxPlansPerProgram = 16;
  // Each host's host programs of `plan`, added to `out`.
  static void AddHostPrograms(const Plan& plan,
                              absl::flat_hash_map<HostId, std::vector<uint64_t>>& out);
  class Lowering;

  // Frees what a client that left held (its runs cancelled; its slices, arrays, functions,
  // programs and trace), once none of its calls is in progress (Disconnect).
  void FreeClient(ClientId client);
  // The client-chosen ids of a run's outputs (RunOptions::outputs), by lowered value, claimed;
  // empty when it chose none.
  absl::StatusOr<absl::flat_hash_map<int, BufferId>> ChosenOutputs(
      ClientId client, const LoweredProgram& lp, const std::vector<BufferId>& outputs);
  // `missing` (a lookup's NotFound), or why `id` was never made if its run failed.
  absl::Status NotMade(ClientId client, BufferId id, const absl::Status& missing) const;
  // An SPMD XLA module (num_partitions > 1) meets its partitions in XLA's in-process
  // collectives: its slice must lie within one worker process. Checked at binding.
  // `hosts`: the slice's, one per device.
  absl::Status CheckSpmdPlacement(FunctionId function, const std::vector<HostId>& hosts,
                                  const std::string& where) const;
  // A shard's intermediate values (FunctionSignature::temp_bytes) must fit in the memory of each
  // of `devices` (a slice, named by `where`), or every launch there would fail: checked at
  // binding and for each compute node of a program (BuildPlan, which checks outputs too).
  absl::Status CheckIntermediatesFit(const FunctionSignature& sig,
                                     absl::Span<const DeviceId> devices,
                                     const std::string& where) const;
  absl::StatusOr<FunctionSignature> Signature(ClientId client, FunctionId id, int num_shards);
  absl::StatusOr<std::shared_ptr<const Plan>> PlanFor(ClientId client, ProgramId id,
                                                      const std::vector<Placement>& args);
  // Why program `prog` (its name, quoted) was refused: its client holds its limit (`full`).
  static absl::Status TooManyPrograms(const std::string& prog, const absl::Status& full);
  absl::StatusOr<std::shared_ptr<const Plan>> BuildPlan(ClientId client, const ProgramIr& ir,
                                                        const std::vector<Placement>& args);
  WorkerInterface* Worker(HostId host) const;
  // A client's checkpoint `path` as an absolute path within the checkpoint root, or why not.
  absl::StatusOr<std::string> CheckpointPath(const std::string& path) const;
  // A new array of `spec` on `slice_id` for `client` (a put's checks and quota), not yet ready:
  // its ready future is `ready`'s. Called within a visit of the client.
  absl::StatusOr<ArrayInfo> NewPutArray(ClientId client, SliceId slice_id, const Sharding& sharding,
                                        const ArraySpec& spec, Future<> ready);
  IslandScheduler* Scheduler(IslandId island) const;
  // The tenants' settings and each one's load over the islands, into `s`.
  void AddTenants(ClusterStatus& s) const;
  std::unique_ptr<IslandScheduler> NewScheduler(IslandId island, int devices);
  // Hands one run's island subgraphs to their schedulers, in one order over all islands; the
  // futures join the islands' acks (enqueued: when the last host enqueued; done). Idle
  // islands' requests are dispatched on the calling thread, after submit_mu_ is released.
  std::pair<Future<absl::Time>, Future<>> HandToSchedulers(
      std::vector<std::pair<IslandId, IslandWork>> works);
  // Deletes the shards of `freed` on their hosts.
  void Free(const std::vector<LogicalBuffer>& freed);
  // Unpins the run's buffers and deletes those now unreferenced. The run's intermediates
  // (`plan.released`, ids by value in `ids`) are deleted by the workers at their last readers;
  // here only when the run failed.
  // Charges `bytes` of new arrays (`what`) to `client`, or ResourceExhausted naming its quota.
  absl::Status ChargeQuota(ClientId client, int64_t bytes, const std::string& what);
  void FinishRun(RunId run, const std::vector<BufferId>& unpin, const Plan& plan,
                 const std::vector<BufferId>& ids, const absl::Status& s);
  std::vector<WorkerInterface*> AllWorkers() const;
  // Assembles buffer `id` (pinned by the caller) into host memory once `ready`.
  Future<HostArray> FetchPinned(BufferId id, std::shared_ptr<const Placement> placement,
                                Future<> ready);

  const Options options_;
  ResourceManager rm_;
  BufferTable buffers_;
  OutputIds output_ids_;
  // Shares, and the handles imported through them: changed together (an import cannot slip past
  // a revocation).
  pw::Mutex shares_mu_;
  ShareTable shares_ ABSL_GUARDED_BY(shares_mu_);

  ClientRegistry clients_;
  ProgramCache<Plan> programs_{kMaxPlansPerProgram,
                               static_cast<size_t>(std::max<int64_t>(
                                   0, options_.definitions.max_programs))};
  mutable pw::Mutex mu_;
  // Functions and programs of connected clients (ids are never reused).
  absl::flat_hash_map<FunctionId, Function> functions_ ABSL_GUARDED_BY(mu_);
  // Per client: how many functions it has registered, and their definitions' bytes.
  struct Registered {
    int64_t functions = 0;
    int64_t bytes = 0;
  };
  absl::flat_hash_map<ClientId, Registered> registered_ ABSL_GUARDED_BY(mu_);
  int64_t next_function_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::pair<FunctionId, int>, FunctionSignature> signatures_
      ABSL_GUARDED_BY(mu_);
  // Hosts, their workers and the islands' schedulers (its own lock; after the members the
  // schedulers' threads use, so they stop first).
  Membership members_;
  // Clients tracing, with their trace's start (trace::Now()).
  absl::flat_hash_map<ClientId, int64_t> traces_ ABSL_GUARDED_BY(mu_);

  // Held while handing one run's subgraphs to their islands' schedulers, so that runs spanning
  // islands reach every scheduler in the same relative order.
  pw::Mutex submit_mu_;
  int64_t next_seq_ ABSL_GUARDED_BY(submit_mu_) = 0;
  WorkQueue completions_;  // Run completion and buffer freeing; drained before the rest.
  RunManager runs_;        // Runs in flight (its timeouts' thread last, so stopped first).
};

}  // namespace pw
