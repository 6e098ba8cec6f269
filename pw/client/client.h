// The C++ client: the paper's programming model (Figure 2) over ControllerInterface.
//
//   auto client = *Client::Connect(controller, "me");
//   Slice s = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
//   BoundFunction a = *client->Pmap(times_two, s);        // compiled function bound to a slice
//   Program f = *client->Trace("f", {{DType::kF32, Shape({2})}},
//                              [&](std::vector<Value> v) { return a(v); });  // one program
//   std::vector<Array> out = *f.Call({host_array});
//
// Calling a BoundFunction with Values (inside Trace) records a node; calling it with Arrays runs
// it at once as its own program (op by op). Arrays are opaque handles to sharded buffers:
// copyable, and the buffer's client reference is dropped when the last copy is destroyed.
// Thread-safety: Client, Slice, BoundFunction, Program and Array are thread-safe; a Tracer (and
// the Values it makes) belongs to the thread running Trace. Arrays, functions and programs must
// not outlive the cluster their client is connected to.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/base/mutex.h"
#include "pw/base/host_array.h"
#include "pw/transport/controller_interface.h"

namespace pw {

class Client;
class Program;
class Tracer;

class Array {
 public:
  Array() = default;
  bool valid() const { return h_ != nullptr; }
  BufferId id() const { return h_->info.id; }
  const ArraySpec& spec() const { return h_->info.global; }
  const Sharding& sharding() const { return h_->info.sharding; }
  SliceId slice() const { return h_->info.slice; }
  // Ready when the run that produces the buffer has finished (or failed, or was refused), or
  // once it is stored.
  Future<> Ready() const;
  Future<HostArray> ToHostAsync() const;
  absl::StatusOr<HostArray> ToHost() const;
  // Where its shards lie: shard i on devices()[i], of host hosts()[i]. For a run's output, known
  // once the controller has accepted the run (these wait for that; empty if it refused it).
  const std::vector<DeviceId>& devices() const { return h_->Placed().devices; }
  const std::vector<HostId>& hosts() const { return h_->Placed().hosts; }
  // A token another client can import the array with (Client::Import), or `options.token`
  // re-pointed at it (ControllerInterface::ShareArray).
  absl::StatusOr<std::string> Share(const ShareOptions& options = {}) const;
  // Written by the workers as the zarr array in directory `path` of the cluster's checkpoint
  // root, once computed (ControllerInterface::SaveArray); ready once written.
  Future<> Save(const std::string& path) const;

 private:
  friend class Client;
  friend class BoundFunction;
  friend class Program;
  struct Handle {
    ControllerInterface* controller;
    ClientId client;
    ArrayInfo info;  // For a run's output: all but devices and hosts (Placed()).
    // A run's output: the run's acceptance (with where output `output` lies), and its end.
    Future<RunInfo> run;
    int output = -1;
    Future<> done;
    const ArrayInfo& Placed() const;
    ~Handle();
  };
  explicit Array(std::shared_ptr<Handle> h) : h_(std::move(h)) {}
  // The controller's read of `h`'s buffer, `h` held until it ends.
  static Future<HostArray> Fetch(std::shared_ptr<Handle> h);
  std::shared_ptr<Handle> h_;
};

// A virtual slice (released with the client, or by Release()).
class Slice {
 public:
  const SliceInfo& info() const { return info_; }
  int num_devices() const { return static_cast<int>(info_.devices.size()); }
  // Where it lies: its physical devices in rank order, the host of each, its islands (sorted).
  const std::vector<DeviceId>& devices() const { return info_.devices; }
  const std::vector<HostId>& hosts() const { return info_.hosts; }
  const std::vector<IslandId>& islands() const { return info_.islands; }
  absl::Status Release() const;

 private:
  friend class VirtualDeviceSet;
  friend class Client;
  Slice(Client* c, SliceInfo info) : client_(c), info_(std::move(info)) {}
  Client* client_;
  SliceInfo info_;
};

class VirtualDeviceSet {
 public:
  absl::StatusOr<Slice> AddSlice(const SliceRequest& request);
  const std::vector<Slice>& slices() const { return slices_; }

 private:
  friend class Client;
  explicit VirtualDeviceSet(Client* c) : client_(c) {}
  Client* client_;
  std::vector<Slice> slices_;
};

// A traced value inside Trace. It names its trace by identity, never by pointer: kept past its
// trace (say, in a global) and used again, it is refused, naming the node, instead of reaching
// a Tracer that has gone.
class Value {
 public:
  const ArraySpec& spec() const { return spec_; }
  // The trace that made it (every trace has its own number).
  uint64_t trace() const { return trace_; }

 private:
  friend class Tracer;
  friend class BoundFunction;
  friend class Client;
  Value(uint64_t trace, ValueRef ref, ArraySpec spec)
      : trace_(trace), ref_(ref), spec_(std::move(spec)) {}
  uint64_t trace_;
  ValueRef ref_;
  ArraySpec spec_;
};

class BoundFunction {
 public:
  const Binding& binding() const { return state_->binding; }
  const std::string& name() const { return state_->name; }
  // Inside Trace: records one node and returns its outputs. Inputs must come from the trace
  // running on this thread (else the trace fails, naming the node); called outside any trace,
  // it records nothing and returns no outputs.
  std::vector<Value> operator()(const std::vector<Value>& inputs) const;
  Value operator()(const Value& input) const;
  // Outside Trace: runs now as a one-node program; returns once it is sent (as Program::Run).
  absl::StatusOr<std::vector<Array>> Call(const std::vector<Array>& inputs,
                                          const RunOptions& options = {}) const;

 private:
  friend class Client;
  struct State {
    Client* client;
    std::string name;
    Binding binding;
    pw::Mutex mu;
    // The one-node program Call runs, made on first use.
    std::shared_ptr<const Program> op ABSL_GUARDED_BY(mu);
  };
  explicit BoundFunction(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

class Program {
 public:
  const ProgramIr& ir() const { return *ir_; }
  ProgramId id() const { return id_; }
  // The sharded dataflow graph the controller lowered this program to.
  absl::StatusOr<std::string> Explain() const;
  // Runs with device-resident arguments; returns once the run is sent, without waiting for the
  // controller: its outputs have ids this client chose, so they can be used (passed to the next
  // run, read, shared) at once. A run the controller refuses (say, an argument released) fails
  // its outputs: their Ready(), ToHost() and the runs given them return the reason.
  absl::StatusOr<std::vector<Array>> Run(const std::vector<Array>& args,
                                         const RunOptions& options = {}) const;
  // As Run, but also the run's completion future.
  absl::StatusOr<std::pair<std::vector<Array>, Future<>>> RunAsync(
      const std::vector<Array>& args, const RunOptions& options = {}) const;
  // Puts host arguments where the program first uses them, then runs.
  absl::StatusOr<std::vector<Array>> Call(const std::vector<HostArray>& args,
                                          const RunOptions& options = {}) const;
  // Puts one host argument where the program first uses it (its spec must match argument i's).
  absl::StatusOr<Array> PutArg(size_t i, HostArray value) const;

 private:
  friend class Client;
  friend class BoundFunction;
  Client* client_ = nullptr;
  ProgramId id_;
  std::shared_ptr<const ProgramIr> ir_;
  std::vector<SliceId> arg_slices_;
  std::vector<Sharding> arg_shardings_;
};

class Tracer {
 public:
  Tracer();   // Becomes this thread's current trace.
  ~Tracer();  // The one before it is current again.
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  // Records an error; Trace returns the first one.
  void Fail(absl::Status s);
  Value Arg(int index) const;
  // The innermost trace running on this thread, or nullptr.
  static Tracer* Current();

 private:
  friend class Client;
  friend class BoundFunction;
  const uint64_t id_;
  Tracer* const outer_;
  ProgramIr ir_;
  absl::Status error_;
  std::vector<SliceId> arg_slices_;
  std::vector<Sharding> arg_shardings_;
  absl::flat_hash_map<std::string, int> name_count_;
};

class Client {
 public:
  // Connects as tenant `options.tenant` with `options.share` (ConnectOptions); where those are
  // unset, $PW_TENANT and $PW_SHARE give them (a share that is not a number is an error).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ControllerInterface* controller,
                                                         const std::string& name,
                                                         ConnectOptions options = {});
  ~Client();  // Disconnects: the controller releases this client's slices and buffers.

  ControllerInterface* controller() const { return controller_; }
  ClientId id() const { return id_; }

  VirtualDeviceSet MakeVirtualDeviceSet() { return VirtualDeviceSet(this); }
  absl::StatusOr<FunctionInfo> Register(const FunctionDef& def);
  // Binds a registered function to a slice, pmap-style: per-shard spec S is the global array
  // [n] + S split along dimension 0 over the slice's n devices.
  absl::StatusOr<BoundFunction> Pmap(const FunctionInfo& fn, const Slice& slice);
  absl::StatusOr<BoundFunction> Pmap(const FunctionDef& def, const Slice& slice);
  // Binds with explicit global specs and shardings for every input and output; each is checked
  // against the function's per-shard specs on the slice here (InvalidArgument naming it).
  absl::StatusOr<BoundFunction> Bind(const FunctionInfo& fn, const Slice& slice,
                                     std::vector<ArraySpec> in_global,
                                     std::vector<Sharding> in_sharding,
                                     std::vector<ArraySpec> out_global,
                                     std::vector<Sharding> out_sharding);

  absl::StatusOr<Array> Put(HostArray value, SliceId slice, const Sharding& sharding);
  // As Put, from an array of `spec` in `bytes`, which must stay unchanged until this returns:
  // a wire client sends a large array's shards from there, without a copy
  // (ControllerInterface::PutArrayFrom).
  absl::StatusOr<Array> PutFrom(const ArraySpec& spec, absl::Span<const uint8_t> bytes,
                                SliceId slice, const Sharding& sharding);
  // The array a share token names now, as a handle of this client's (Array::Share).
  absl::StatusOr<Array> Import(const std::string& token);
  // Ends a share this client made: clients that imported through it lose those arrays.
  absl::Status Revoke(const std::string& token);
  // Checkpoints (ControllerInterface::LoadArray, CommitCheckpoint): an array of `spec` sharded
  // as `sharding` on `slice`, read by the workers from the zarr array at `path` (any chunk shape,
  // so another sharding's); and the commit of a checkpoint written into `path`.
  absl::StatusOr<Array> Load(SliceId slice, const Sharding& sharding, const ArraySpec& spec,
                             const std::string& path);
  absl::StatusOr<std::string> CommitCheckpoint(
      const std::string& path, const std::vector<std::pair<std::string, std::string>>& files,
      const std::string& final_path);
  absl::StatusOr<Program> Trace(const std::string& name, const std::vector<ArraySpec>& args,
                                const std::function<std::vector<Value>(std::vector<Value>)>& fn);

  // A timeline of the cluster (pw/trace; not to be confused with Trace, which traces a
  // program): spans recorded from StartTrace to StopTrace on every process of the cluster and
  // in this one (this client's calls), on the controller's clock. `all_tenants`: see
  // ControllerInterface::StopTrace.
  absl::Status StartTrace();
  absl::StatusOr<trace::Chunk> StopTrace(bool all_tenants = false);

 private:
  friend class Program;
  friend class BoundFunction;
  Client(ControllerInterface* c, ClientId id) : controller_(c), id_(id) {}
  Array Adopt(const ArrayInfo& info);
  // `n` ids for a run's outputs, from ranges this client reserved (in increasing order). The
  // controller takes each lease's ids in increasing order, so a caller holds submit_mu_ from
  // taking them until its run is submitted: two threads' runs then reach it in id order.
  absl::StatusOr<std::vector<BufferId>> TakeOutputIds(int n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  pw::Mutex submit_mu_;
  static constexpr int64_t kOutputIdLease = 16384;  // Ids reserved at a time.
  // Bind, given the function's per-shard outputs on the slice (LoadFunction's answer).
  absl::StatusOr<BoundFunction> BindLoaded(const FunctionInfo& fn,
                                           const std::vector<ArraySpec>& outs, const Slice& slice,
                                           std::vector<ArraySpec> in_global,
                                           std::vector<Sharding> in_sharding,
                                           std::vector<ArraySpec> out_global,
                                           std::vector<Sharding> out_sharding);
  // The flow from a call's span to the controller's (called while a trace records).
  uint64_t NextCallFlow();
  ControllerInterface* controller_;
  ClientId id_;
  pw::Mutex ids_mu_;
  int64_t ids_next_ ABSL_GUARDED_BY(ids_mu_) = 0;  // Reserved ids [next, end) not yet taken.
  int64_t ids_end_ ABSL_GUARDED_BY(ids_mu_) = 0;
  pw::Mutex trace_mu_;
  int64_t trace_since_ ABSL_GUARDED_BY(trace_mu_) = -1;  // This process's clock; -1: off.
  std::atomic<int64_t> calls_{0};
  trace::ClockOffset controller_clock_;  // The controller's clock minus this process's.
};

}  // namespace pw
