// Messages between client, controller and workers. Plain structs: the in-process transport
// passes them as they are; a wire transport maps each to a versioned message.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/base/shape.h"
#include "pw/base/sharding.h"
#include "pw/cluster/cluster_spec.h"

namespace pw {

// How a program's host-side work reaches the workers.
enum class DispatchMode {
  // All nodes' host-side work at once: one message per host for the whole island subgraph.
  kParallel,
  // Node by node: each node of an island's subgraph is dispatched after the previous one (in
  // topological order, so after its predecessors) has been enqueued on all of its hosts.
  kSequential,
};
absl::string_view DispatchModeName(DispatchMode m);

// How one run is submitted. Implicitly made from a DispatchMode (a run without a timeout of its
// own).
struct RunOptions {
  RunOptions(DispatchMode m = DispatchMode::kParallel) : mode(m) {}  // NOLINT: implicit.
  DispatchMode mode;
  // > 0: the run is cancelled if it has not finished this long after it was submitted; its
  // client sees DEADLINE_EXCEEDED naming the run, program and timeout at once (the cluster's
  // default when 0: Controller::Options::default_run_timeout).
  absl::Duration timeout = absl::ZeroDuration();
  // Nonzero while the client traces (pw/trace): the flow from its call span to the
  // controller's submit span.
  uint64_t trace_flow = 0;
  // Ids for the program's outputs, one per output (the same id where two outputs are one
  // value), from ControllerInterface::ReserveBufferIds; empty: the controller picks them.
  std::vector<BufferId> outputs;
};

// Buffers in host programs are value indices of the lowered program; each run maps them to its
// own BufferIds (HostWork::buffers).

// A slice's devices in rank order, shared by every node on the slice (a plan names each slice's
// devices once, not once per node and host).
using SliceDevices = std::shared_ptr<const std::vector<DeviceId>>;

// One compute node's shards on one host.
struct ComputeWork {
  FunctionId function;
  SliceDevices slice_devices;  // All shards, in rank order; never null.
  std::vector<int> local_ranks;         // The ranks on this host.
  std::vector<int> inputs;              // Value indices.
  std::vector<int> outputs;
  // Intermediates this node reads last: each device drops its shard of them once its shard of
  // this node has run, so a long chain holds a few buffers at a time, not one per node.
  std::vector<int> release;
};

// One transfer node's destination shards on one host: the host receives (pulls) the regions of
// `src` that its shards of `dst` need.
struct TransferWork {
  int src = 0;  // Value indices.
  int dst = 0;
  ArraySpec global;
  Sharding src_sharding;
  std::vector<DeviceId> src_devices;
  std::vector<HostId> src_hosts;
  Sharding dst_sharding;
  std::vector<DeviceId> dst_devices;
  std::vector<int> local_ranks;  // Destination ranks on this host.
  LinkClass link = LinkClass::kIci;
};

struct NodeWork {
  int32_t node = 0;  // Index in the lowered program.
  std::string name;
  std::variant<ComputeWork, TransferWork> work;
};

// One host's part of an island subgraph of a program: a static subgraph, built once when the
// program is lowered and shared by all of its runs. Nodes are in topological (gang) order.
struct HostProgram {
  uint64_t id = 0;  // Unique in the controller's process; a wire transport sends a body once per id.
  std::string program;
  std::vector<NodeWork> nodes;
};

// What one host does for one run: nodes [begin, end) of its host program, with the run's buffers.
struct HostWork {
  RunId run;
  ClientId client;  // Whose run (its trace spans name it).
  std::shared_ptr<const HostProgram> program;
  std::shared_ptr<const std::vector<BufferId>> buffers;  // Value index -> this run's buffer.
  size_t begin = 0;
  size_t end = 0;
  // Whether the host says at once that the work is enqueued (sequential dispatch waits for it
  // before the next node); else a worker process may say so with the work's end (one message,
  // not two), giving when it was enqueued.
  bool ack_enqueue_at_once = true;
  BufferId buffer(int value) const { return (*buffers)[value]; }
};

struct DispatchAck {
  // Host-side work done: every item is on its device queue; when (this process's clock). From
  // a worker process, for work not acknowledged at once (HostWork::ack_enqueue_at_once), it is
  // ready only with the work's end, giving the earlier instant; an error if it never was.
  Future<absl::Time> enqueued;
  // Every item has finished: the device time they took (nanoseconds, summed over the devices:
  // each device's time in the work's launches, from each launch to its outputs; what a device
  // waited for before a launch, its inputs, memory or a compile, is not counted, a collective's
  // wait for its peers inside a launch is), or the first error, naming the node.
  Future<int64_t> done;
};

// Client I/O beside the controller: one shard a client sends or reads itself, on a worker's
// data plane (its bulk stream, pw/dataplane/bulk_server.h), under a one-use key.
struct ShardTransfer {
  int rank = 0;         // The shard's index in the array's sharding.
  std::string address;  // host:port of the worker's bulk stream.
  std::string key;
};
// A shard a client uploads (WorkerInterface::ExpectUpload): `accepted` once the host expects its
// bytes (where to send them), `stored` once they are on the device.
struct UploadAck {
  Future<ShardTransfer> accepted;
  Future<> stored;
};

// A shard's place in a checkpoint (pw/checkpoint): the zarr array in directory `dir` (Orbax's
// layout), of `global` in chunks of `chunks`, and the shard's region `box` of it.
struct ShardFile {
  std::string dir;
  ArraySpec global;
  Shape chunks;  // WorkerInterface::SaveShard's; LoadShard reads the array's own.
  Box box;
};

struct DeviceStatus {
  DeviceId id;
  HostId host;
  IslandId island;
  bool alive = true;
  int64_t memory_capacity = 0;
  int64_t memory_in_use = 0;
  size_t memory_waiters = 0;
  size_t queue_depth = 0;
  int64_t executed = 0;
  int64_t busy_ns = 0;  // Device::busy_ns.
};

struct HostStatus {
  HostId host;
  IslandId island;
  std::vector<DeviceStatus> devices;
  size_t buffers = 0;
  int64_t buffer_bytes = 0;
  int64_t ici_bytes_received = 0;
  int64_t dcn_bytes_received = 0;
  size_t dispatch_queue_depth = 0;
  size_t cancelled_shards = 0;  // Shards of cancelled runs that were not run.
  size_t functions = 0;    // Functions loaded (registered and not unloaded).
  size_t executables = 0;  // Their compiled executables (per slice shape), compiling included.
  size_t programs = 0;  // Host program bodies a worker process keeps (in process: the controller's).
  size_t plans = 0;     // Dispatch plans cached (per host program and range; hold executables).
  int64_t compiles = 0;         // XLA compilations run (per-shard at binding, SPMD at first use).
  int64_t compile_ns = 0;       // Their time.
  int64_t executable_hits = 0;  // Executable lookups served from the cache (no compile).
  int64_t collectives = 0;      // Collectives this host's shards ran (native and runtime).
  int64_t collective_ns = 0;    // Their time, summed over shards.
  // Device time (Device::busy_ns's part spent on each client's work), by client: launches'
  // time, the ones running at the snapshot counted up to it (ClientTime).
  std::vector<std::pair<ClientId, int64_t>> client_device_ns;
  // Non-empty when the host's status could not be had (the counts above are then empty).
  std::string error;
  // Of the bytes received (above), those that crossed the wire: whole source shards fetched
  // from remote workers (WorkerInterface::remote), collective inputs from other processes; none
  // in process.
  int64_t ici_wire_bytes_received = 0;
  int64_t dcn_wire_bytes_received = 0;
  // Checkpoints: the bytes of the shards this host wrote (WorkerInterface::SaveShard) and read
  // (LoadShard).
  int64_t checkpoint_bytes_saved = 0;
  int64_t checkpoint_bytes_loaded = 0;
  // A worker process's command stream: the commands read, and the messages they came in (a
  // message carries a batch); the events it sent back. None in process.
  int64_t commands_received = 0;
  int64_t command_messages_received = 0;
  int64_t events_sent = 0;  // Its answers on that stream (enqueued, done).
  int64_t event_messages_sent = 0;  // The messages they went in.
  // Answers to peers' small fetches mailed to them (same machine) instead.
  int64_t events_mailed = 0;
};

}  // namespace pw
