// ControllerInterface: what a client asks of the single controller.
//
// Implemented in-process by Controller (pw/controller) and, over a wire, by a remote stub, so the
// embedded cluster and a distributed one run the same client code. Thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pw/trace/trace.h"
#include "pw/base/future.h"
#include "pw/base/host_array.h"
#include "pw/base/ids.h"
#include "pw/base/sharding.h"
#include "pw/executor/function_def.h"
#include "pw/program/program_ir.h"
#include "pw/resource_manager/resource_manager.h"
#include "pw/transport/messages.h"

namespace pw {

struct FunctionInfo {
  FunctionId id;
  std::string name;
  std::vector<ArraySpec> inputs;   // Per shard.
};

struct ArrayInfo {
  BufferId id;
  ArraySpec global;
  Sharding sharding;
  SliceId slice;                 // The slice it was made on (its maker's: an imported array's
                                 // slice is another client's).
  std::vector<DeviceId> devices;  // Shard i lives on devices[i], of host hosts[i].
  std::vector<HostId> hosts;
};

// ControllerInterface::BeginPut's answer: the array, and where to send each rank's shard.
struct DirectPut {
  ArrayInfo info;
  std::vector<ShardTransfer> shards;  // One per rank.
};
// ControllerInterface::LocateArray's answer: the bytes, or where each distinct shard is offered.
struct LocatedArray {
  std::optional<HostArray> value;
  ArraySpec spec;
  Sharding sharding;
  std::vector<ShardTransfer> shards;
};

// Sharing an array with other clients (ControllerInterface::ShareArray).
struct ShareOptions {
  bool writable = false;  // Holders of the token may re-point it at their own arrays.
  std::string token;      // Empty: a new share. Else re-point this share at the array.
};

struct RunInfo {
  RunId run;
  std::vector<ArrayInfo> outputs;  // Handles the client now holds (one reference each).
  Future<> done;                   // Ready when every node has finished; the first error.
};

// How a client joins the cluster (ControllerInterface::Connect).
struct ConnectOptions {
  // The tenant whose share of device time pays for the client's work, with every other client
  // of the same tenant ("": a tenant of its own, named after the client). Its clients' runs keep
  // their order on each island; tenants' runs interleave by share (pw/scheduler).
  std::string tenant;
  // The tenant's share (Tenant::kMinShare ... kMaxShare; 0: leave it as it is, 1 for a new
  // tenant). A share the cluster's admin set (SetTenant) is kept, whatever clients ask.
  double share = 0;
};
// A tenant's settings, which an admin sets (ControllerInterface::SetTenant; `pw tenant set`).
struct TenantSettings {
  std::string name;
  std::optional<double> share;
  // The bytes of arrays the tenant's clients may hold on the cluster together (0: no quota).
  std::optional<int64_t> memory_bytes;
};
// Names: at most kMaxTenantName characters, letters, digits and ._- (':' only from an admin:
// clients' own tenants are "<client>:<id>", and a client may not name one)
inline constexpr size_t kMaxTenantName = 128;

struct ClusterStatus {
  std::vector<HostStatus> hosts;
  size_t logical_buffers = 0;
  // A finishing run is counted completed before it leaves runs_in_flight (its client may see it
  // done in between), so for a moment it can be in both.
  size_t runs_in_flight = 0;
  int64_t runs_completed = 0;
  std::vector<size_t> scheduler_queue_depth;  // Per island.
  // Per island: the control round trip its scheduler keeps its window on top of (zero until
  // measured; pw/scheduler/README.md).
  std::vector<int64_t> scheduler_round_trip_ns;
  struct Running {
    RunId run;
    ClientId client;
    std::string program;
  };
  std::vector<Running> running;  // Runs in flight, oldest first (at most kMaxRunningListed).
  struct FailedHost {
    HostId host;
    std::string reason;
  };
  // Hosts whose worker failed and has not rejoined (Controller::FailHost), by host. Filled by
  // an in-process Controller only; a process cluster's status says it through its members
  // (RemoteController::FullStatus).
  std::vector<FailedHost> failed_hosts;
  static constexpr size_t kMaxRunningListed = 64;
  std::string scheduling;  // The islands' policy: "share" or "fifo".
  struct Tenant {
    std::string name;
    double share = 1;
    bool pinned = false;            // An admin set its share or quota.
    int64_t memory_quota_bytes = 0;  // 0: none.
    int64_t memory_bytes = 0;        // Held by its clients now.
    int clients = 0;
    int64_t queued = 0;  // Its requests waiting in the islands' schedulers.
    // Its fraction of the device time of work that finished in the last second (all islands).
    double achieved_share = 0;
    double device_seconds = 0;  // Its work's device time since it appeared, over every island.
  };
  std::vector<Tenant> tenants;  // By name.
};

class ControllerInterface {
 public:
  virtual ~ControllerInterface() = default;

  virtual absl::StatusOr<ClientId> Connect(const std::string& name,
                                           const ConnectOptions& options) = 0;
  absl::StatusOr<ClientId> Connect(const std::string& name) { return Connect(name, {}); }
  // Refuses the client's calls from now on and releases its slices, buffers, functions and
  // programs (the controller: once none of its calls is in progress; it does not wait).
  virtual absl::Status Disconnect(ClientId client) = 0;

  virtual absl::StatusOr<SliceInfo> AllocateSlice(ClientId client, const SliceRequest& request) = 0;
  virtual absl::Status ReleaseSlice(ClientId client, SliceId slice) = 0;

  virtual absl::StatusOr<FunctionInfo> RegisterFunction(ClientId client,
                                                        const FunctionDef& def) = 0;
  // Per-shard output specs of `function` loaded for `slice` (compiles for that slice shape).
  virtual absl::StatusOr<std::vector<ArraySpec>> LoadFunction(ClientId client, FunctionId function,
                                                              SliceId slice) = 0;

  // Validates and lowers the program now, with each argument placed where its first consumer
  // wants it; runs with arguments laid out differently are lowered (once per layout) when run.
  virtual absl::StatusOr<ProgramId> RegisterProgram(ClientId client, const ProgramIr& ir) = 0;
  // The program's sharded dataflow graph (as lowered for its first argument layout), for people.
  virtual absl::StatusOr<std::string> ExplainProgram(ClientId client, ProgramId program) = 0;
  // `count` consecutive buffer ids for `client` to name its runs' outputs with
  // (RunOptions::outputs); returns the first. Each names one output once, in increasing order.
  // Limits: OutputIds (pw/controller/output_ids.h).
  virtual absl::StatusOr<BufferId> ReserveBufferIds(ClientId client, int64_t count) = 0;
  // Ready once the run has been validated, lowered and handed to its islands' gang schedulers
  // (it does not wait for the hosts); RunInfo::done follows when it has executed (or failed,
  // was cancelled, or overran its timeout). With RunOptions::outputs, the outputs have those ids,
  // so a client may use them before this is ready (its later calls must reach the controller
  // after this one: the wire client sends them in order on its session).
  virtual Future<RunInfo> Submit(ClientId client, ProgramId program,
                                 const std::vector<BufferId>& args, const RunOptions& options) = 0;

  virtual absl::StatusOr<ArrayInfo> PutArray(ClientId client, SliceId slice,
                                             const Sharding& sharding, HostArray value) = 0;
  // As PutArray, from an array of `spec` whose bytes the caller keeps unchanged until the call
  // returns. A transport that can send them where they are does (a wire client's direct I/O);
  // otherwise they are copied into a HostArray.
  virtual absl::StatusOr<ArrayInfo> PutArrayFrom(ClientId client, SliceId slice,
                                                 const Sharding& sharding, const ArraySpec& spec,
                                                 absl::Span<const uint8_t> bytes) {
    return PutArray(client, slice, sharding,
                    HostArray{spec, Bytes(bytes.begin(), bytes.end())});
  }
  virtual Future<HostArray> FetchArray(ClientId client, BufferId id) = 0;
  virtual Future<> ArrayReady(ClientId client, BufferId id) = 0;
  // Client I/O beside the controller, for a client in another process: the array's bytes go
  // between the client and the workers' data planes, not through the controller. BeginPut makes
  // the array (as PutArray, from `spec` alone) and answers where the client sends each rank's
  // shard; the array is ready once every shard arrived (a shard not sent within the workers'
  // client transfer timeout fails it). LocateArray answers small arrays' bytes (under
  // kDirectIoMinBytes, or all with `inline_only`) and otherwise where each distinct shard is
  // offered to be read once. Unimplemented when the workers are in process. The wire client
  // (pw/rpc/remote_controller.h) puts arrays of kDirectIoMinBytes or more this way.
  static constexpr int64_t kDirectIoMinBytes = int64_t{1} << 20;
  virtual Future<DirectPut> BeginPut(ClientId client, SliceId slice, const Sharding& sharding,
                                     const ArraySpec& spec) = 0;
  virtual Future<LocatedArray> LocateArray(ClientId client, BufferId id, bool inline_only) = 0;
  virtual absl::Status ReleaseArray(ClientId client, BufferId id) = 0;

  // Checkpoints in Orbax's on-disk layout (zarr v2 per array; pw/checkpoint), written and read by
  // the workers, not through the controller or the client. A `path` is relative to the cluster's
  // checkpoint root (Controller::Options::checkpoint_root), or absolute within it; ".." is
  // refused. SaveArray writes array `id` as the zarr array in directory `path` (made here, with
  // its .zarray; one chunk per shard): each distinct shard by one worker holding it; ready once
  // every shard is written. LoadArray makes an array of `spec` sharded as `sharding` on `slice`
  // (a handle now, as PutArray), each shard read by its worker from the zarr array at `path`
  // (any chunk shape, raw or zstd: another sharding's checkpoint, or stock Orbax's); ready once
  // read. CommitCheckpoint writes `files` (Orbax's metadata: _METADATA, _CHECKPOINT_METADATA,
  // _sharding, commit_success.txt; each new, synced) into directory `path` and renames it to
  // `final_path` at once (a directory there already is an error), and answers `final_path` as
  // an absolute path. A save waits for the array to be made (a failed run's error ends it) and
  // syncs what it wrote.
  virtual Future<> SaveArray(ClientId client, BufferId id, const std::string& path) = 0;
  virtual absl::StatusOr<ArrayInfo> LoadArray(ClientId client, SliceId slice,
                                              const Sharding& sharding, const ArraySpec& spec,
                                              const std::string& path) = 0;
  virtual absl::StatusOr<std::string> CommitCheckpoint(
      ClientId client, const std::string& path,
      const std::vector<std::pair<std::string, std::string>>& files,
      const std::string& final_path) = 0;

  // Arrays shared between clients. ShareArray returns a capability token for an array `client`
  // holds (or re-points one, ShareOptions::token). Any client with the token imports the array
  // the token names now (a handle of its own: the buffer lives while any client holds one,
  // charged to its owner). The owner's RevokeShare ends the share and drops every handle imported
  // through it; the owner's disconnect ends its shares and leaves imported handles alone.
  virtual absl::StatusOr<std::string> ShareArray(ClientId client, BufferId id,
                                                 const ShareOptions& options) = 0;
  virtual absl::StatusOr<ArrayInfo> ImportArray(ClientId client, const std::string& token) = 0;
  virtual absl::Status RevokeShare(ClientId client, const std::string& token) = 0;

  // An error only when the controller cannot be asked; a host it cannot ask is listed with
  // HostStatus::error.
  virtual absl::StatusOr<ClusterStatus> Status() = 0;
  // The admin's: sets a tenant's share and memory quota (made if new; kept while it has them,
  // whether or not it has clients). Over the wire it needs the cluster token.
  virtual absl::Status SetTenant(const TenantSettings& settings) = 0;

  // Tracing (pw/trace). StartTrace turns span recording on in every process of the cluster
  // until the client's StopTrace or disconnect (one trace per client at a time: a second is
  // FailedPrecondition); returns the controller's clock (trace::Now()), for the caller's offset.
  virtual absl::StatusOr<int64_t> StartTrace(ClientId client) = 0;
  // The spans recorded since the client's StartTrace, from every process, on the controller's
  // clock. Other clients' spans are anonymized (trace::Anonymize) unless `all_tenants`, which
  // over the wire needs the cluster token (the admin's `pw trace`).
  virtual Future<trace::Chunk> StopTrace(ClientId client, bool all_tenants) = 0;
};

// The cluster's status with every host's counts: an error naming the first host that could not
// be asked (for callers that add up counts, where a missing host would read as zeros).
absl::StatusOr<ClusterStatus> StatusOfEveryHost(ControllerInterface& controller);

// Bytes the cluster's workers have received over each link class, summed over hosts (an error
// as StatusOfEveryHost's when a host cannot be asked).
struct LinkBytes {
  int64_t ici = 0;  // Logical: what transfers wrote into their shards, collectives' inputs.
  int64_t dcn = 0;
  int64_t ici_wire = 0;  // Of those, the bytes that crossed the wire (HostStatus).
  int64_t dcn_wire = 0;
};
absl::StatusOr<LinkBytes> ReceivedBytes(ControllerInterface& controller);

}  // namespace pw
