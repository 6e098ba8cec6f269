#include "pw/controller/controller.h"

#include <algorithm>
#include <atomic>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pw/base/status_macros.h"

namespace pw {

// A lowered program plus, per island, the subgraph each host receives. In the templates,
// BufferId fields hold value indices of `lowered`; Submit maps them to the run's buffers.
struct Controller::Plan {
  LoweredProgram lowered;
  std::vector<SliceId> slices;
  // Per island (ascending), each host's static subgraph.
  std::vector<std::pair<IslandId, std::vector<std::pair<HostId, std::shared_ptr<const HostProgram>>>>>
      islands;
  std::vector<int> island_devices;  // Per island: the devices its computations use.
  std::vector<int> output_refs;                           // Client handles per value.
  // Values some node reads last (LoweredNode::release): the workers delete their shards.
  std::vector<bool> released;
  int64_t num_released = 0;
  // Bytes of the buffers a run creates and lists (not arguments, not released intermediates),
  // charged to the client's quota per run.
  int64_t listed_bytes = 0;
};

namespace {

absl::Status NoWorker(HostId host) {
  return absl::UnavailableError(absl::StrCat(host.ToString(), " has no worker"));
}
// Another client's function or program reads as one that does not exist: ids reveal nothing.
template <typename IdT>
absl::Status NotRegistered(IdT id) {
  return absl::NotFoundError(absl::StrCat(id.ToString(), " is not registered by this client"));
}
int64_t PlacedBytes(const Placement& p) {
  return p.shard_bytes() * static_cast<int64_t>(p.devices.size());
}
}  // namespace

void Controller::AddHostPrograms(const Plan& plan,
                                 absl::flat_hash_map<HostId, std::vector<uint64_t>>& out) {
  for (const auto& [island, hosts] : plan.islands)
    for (const auto& [host, program] : hosts) out[host].push_back(program->id);
}

class Controller::Lowering final : public LoweringContext {
 public:
  Lowering(Controller* c, ClientId client) : c_(c), client_(client) {}
  absl::StatusOr<SliceInfo> ResolveSlice(SliceId slice) const override {
    return c_->rm_.ResolveSlice(client_, slice);
  }
  absl::StatusOr<FunctionSignature> LoadSignature(FunctionId f, int n) const override {
    return c_->Signature(client_, f, n);
  }

 private:
  Controller* c_;
  ClientId client_;
};

namespace {
std::string LayoutKey(const std::vector<Placement>& args) {
  std::string key;
  for (const auto& p : args)
    absl::StrAppend(&key, p.slice.value(), "/", JoinIds(p.devices), "/", p.global.ToString(), "/",
                    p.sharding.ToString(), ";");
  return key;
}
}  // namespace

Controller::Controller(const ClusterSpec& spec, Options options)
    : options_(options),
      rm_(spec),
      members_(spec, [this](IslandId island, int devices) { return NewScheduler(island, devices); }),
      completions_("pw-ctrl"),
      runs_([this] { return members_.Workers(); }, options_.on_run_done) {}

std::unique_ptr<IslandScheduler> Controller::NewScheduler(IslandId island, int devices) {
  std::unique_ptr<SchedulingPolicy> policy;
  if (options_.scheduling.policy == "fifo") policy = std::make_unique<FifoPolicy>();
  else policy = std::make_unique<SharePolicy>();
  IslandScheduler::Options o;
  o.devices = std::max(1, devices);
  o.window = options_.scheduling.window;
  auto workers = [this](HostId h, uint64_t epoch) { return members_.Worker(h, epoch); };
  return std::make_unique<IslandScheduler>(island, std::move(policy), std::move(workers), o);
}

Controller::~Controller() { WaitIdle(); }

void Controller::WaitIdle() { runs_.WaitIdle(); }

absl::Status Controller::JoinHost(HostId host, IslandId island, WorkerInterface* worker) {
  const std::vector<DeviceSpec> devices = rm_.HostDevices(host);
  // The other workers' collectives take its devices back before any work can name them.
  for (const DeviceSpec& d : devices)
    for (WorkerInterface* w : AllWorkers()) (void)w->RestoreDevice(d.id);  // Best effort.
  // Attached before the functions to load are read: LoadOnHosts (under mu_) either finds the
  // worker and loads a function itself, or marks the host for the loop below.
  members_.Attach(host, island, worker);
  std::vector<std::pair<FunctionId, FunctionDef>> fns;
  {
    pw::MutexLock lock(&mu_);
    for (const auto& [id, f] : functions_)
      if (f.loaded_on.contains(host)) fns.emplace_back(id, f.def);
  }
  std::vector<Future<>> loads;  // In parallel.
  for (const auto& [id, def] : fns) loads.push_back(worker->LoadFunction(id, def));
  if (absl::Status loaded = JoinFutures(loads).Await(); !loaded.ok()) {
    FailHost(host, absl::StrCat("its functions did not load: ", loaded.message()));
    return loaded;
  }
  // Last: slices on its devices resolve again once it can run what they are bound to.
  for (const DeviceSpec& d : devices) PW_RETURN_IF_ERROR(rm_.RestoreDevice(d.id));
  return absl::OkStatus();
}

void Controller::FailHost(HostId host, const std::string& reason) {
  const std::string why = absl::StrCat(host.ToString(), " failed: ", reason);
  // Lost before the epoch advances (Detach): a run submitted at an earlier epoch is never
  // dispatched to the host (Membership::Worker), and one submitted at a later epoch finds its
  // arguments lost.
  buffers_.LoseHost(host, absl::UnavailableError(why));
  members_.Detach(host, reason);
  for (const DeviceSpec& d : rm_.HostDevices(host)) (void)RemoveDevice(d.id, why);
}

std::vector<WorkerInterface*> Controller::AllWorkers() const { return members_.Workers(); }

WorkerInterface* Controller::Worker(HostId host) const { return members_.Worker(host); }

IslandScheduler* Controller::Scheduler(IslandId island) const {
  return members_.Scheduler(island);
}

Future<> Controller::RemoveDevice(DeviceId device, const std::string& reason) {
  absl::StatusOr<DeviceSpec> spec = rm_.Device(device);
  if (!spec.ok()) return Future<>::Ready(spec.status());
  if (absl::Status s = rm_.RemoveDevice(device, reason); !s.ok()) return Future<>::Ready(s);
  const absl::Status why =
      absl::UnavailableError(absl::StrCat(device.ToString(), " was removed: ", reason));
  // Every worker hears of it, in parallel: the owner fails the device's queued work; the others
  // abort their collectives that include it (each worker process has its own).
  Future<> owner = Future<>::Ready(absl::OkStatus());
  for (WorkerInterface* w : AllWorkers()) {
    Future<> told = w->RemoveDevice(device, why);
    if (w->host() == spec->host) owner = told;
  }
  return owner;
}

absl::StatusOr<ClientId> Controller::Connect(const std::string& name,
                                             const ConnectOptions& options) {
  return clients_.Connect(name, options);
}

absl::Status Controller::SetTenant(const TenantSettings& settings) {
  return clients_.SetTenant(settings);
}

absl::Status Controller::Disconnect(ClientId client) {
  // The client's calls are refused from here; what it holds goes once none of its calls is in
  // progress (ClientRegistry::Disconnect), so nothing such a call makes outlives it.
  return clients_.Disconnect(client, [this, client] { FreeClient(client); });
}

void Controller::FreeClient(ClientId client) {
  // Runs still in flight are cancelled: what has not launched yet (on any island) fails
  // instead of running. Told before the buffers go, so nothing waiting on freed memory runs.
  runs_.CancelClient(client, absl::CancelledError(absl::StrCat(client.ToString(), " disconnected")),
                     /*end_them=*/false);
  StopTrace(client, false).OnReady([](const absl::StatusOr<trace::Chunk>&) {});  // If tracing.
  rm_.ReleaseClient(client);
  output_ids_.Drop(client);
  {
    pw::MutexLock lock(&shares_mu_);
    shares_.ForgetOwner(client);
  }
  Free(buffers_.ReleaseClient(client));
  // Its functions (modules of any size) and programs go too: a long-lived cluster serves clients
  // without end. Ids are not reused; a freed one reads as never registered.
  std::vector<FunctionId> freed;
  absl::flat_hash_map<HostId, std::vector<FunctionId>> unload;  // Where each was loaded.
  absl::flat_hash_map<HostId, std::vector<uint64_t>> host_programs;
  for (const auto& plan : programs_.DropClient(client)) AddHostPrograms(*plan, host_programs);
  {
    pw::MutexLock lock(&mu_);
    registered_.erase(client);
    absl::erase_if(functions_, [&](const auto& kv) {
      if (kv.second.owner != client) return false;
      for (HostId h : kv.second.loaded_on) unload[h].push_back(kv.first);
      freed.push_back(kv.first);
      return true;
    });
    for (auto it = signatures_.begin(); it != signatures_.end();) {
      if (std::find(freed.begin(), freed.end(), it->first.first) != freed.end())
        signatures_.erase(it++);
      else
        ++it;
    }
  }
  const std::vector<WorkerInterface*> workers = members_.Workers();
  // The workers' copies go too (compiled executables, host programs and their plans), after
  // the runs' cancellations.
  for (WorkerInterface* w : workers) {
    std::vector<FunctionId> functions;
    std::vector<uint64_t> programs;
    if (auto it = unload.find(w->host()); it != unload.end()) functions = std::move(it->second);
    if (auto it = host_programs.find(w->host()); it != host_programs.end())
      programs = std::move(it->second);
    if (!functions.empty() || !programs.empty()) w->Unload(functions, programs);
  }
}

absl::Status Controller::CancelRun(RunId run, const absl::Status& why) {
  return runs_.Cancel(run, why);
}

std::vector<RunId> Controller::CancelClientRuns(ClientId client, const absl::Status& why) {
  return runs_.CancelClient(client, why, /*end_them=*/true);
}

size_t Controller::num_clients() const { return clients_.size(); }

absl::StatusOr<SliceInfo> Controller::AllocateSlice(ClientId client, const SliceRequest& request) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  return rm_.AllocateSlice(client, request);
}

absl::Status Controller::ReleaseSlice(ClientId client, SliceId slice) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  return rm_.ReleaseSlice(client, slice);
}

absl::StatusOr<FunctionInfo> Controller::RegisterFunction(ClientId client,
                                                          const FunctionDef& def) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  // Kernels and shapes, before anything runs (SPMD modules for their own partition count).
  const auto* hlo = std::get_if<StableHloFunctionDef>(&def);
  if (hlo != nullptr) {
    const int64_t devices = static_cast<int64_t>(rm_.Devices().size());
    if (std::max(hlo->num_partitions, hlo->collective_axis_size) > devices)
      return absl::InvalidArgumentError(absl::StrCat(
          "function '", hlo->name, "' has ", hlo->num_partitions, " partitions and collective axis "
          "size ", hlo->collective_axis_size, ", but the cluster has only ", devices,
          " devices: it could never run"));
  }
  PW_ASSIGN_OR_RETURN(FunctionSignature sig,
                      SignatureOf(def, hlo == nullptr ? 1
                                           : std::max({1, hlo->num_partitions,
                                                       hlo->collective_axis_size})));
  // Workers load it when it is bound to a slice on their host (LoadFunction, BuildPlan).
  const int64_t bytes = DefinitionBytes(def);
  const Options::Definitions& limit = options_.definitions;
  pw::MutexLock lock(&mu_);
  Registered& mine = registered_[client];
  if (mine.functions >= limit.max_functions)
    return absl::ResourceExhaustedError(absl::StrCat(
        "function '", sig.name, "' was not registered: ", client.ToString(), " has ",
        mine.functions, " functions registered, its limit (pw controller "
        "--max-client-functions); its functions are freed when it disconnects"));
  if (mine.bytes + bytes > limit.max_function_bytes)
    return absl::ResourceExhaustedError(absl::StrCat(
        "function '", sig.name, "' (", bytes, " bytes of definition) was not registered: ",
        client.ToString(), "'s functions already hold ", mine.bytes, " bytes, and its limit is ",
        limit.max_function_bytes, " (pw controller --max-client-function-bytes); its functions "
        "are freed when it disconnects"));
  ++mine.functions;
  mine.bytes += bytes;
  const FunctionId id(next_function_++);
  functions_.emplace(id, Function{client, def, {}});
  return FunctionInfo{id, sig.name, sig.inputs};
}

absl::Status Controller::EnsureLoadedOn(FunctionId function, const std::vector<HostId>& hosts) {
  pw::MutexLock lock(&mu_);
  auto it = functions_.find(function);
  if (it == functions_.end()) return NotRegistered(function);
  const Function& f = it->second;
  for (HostId h : hosts)
    if (!f.loaded_on.contains(h))
      return absl::FailedPreconditionError(absl::StrCat(
          function.ToString(), " is not bound to a slice on ", h.ToString(),
          ": bind it to the node's slice first (Client::Bind / LoadFunction loads it there)"));
  return absl::OkStatus();
}

absl::Status Controller::LoadOnHosts(FunctionId function, const std::vector<HostId>& hosts) {
  std::vector<WorkerInterface*> workers;
  FunctionDef def;
  {
    pw::MutexLock lock(&mu_);
    auto it = functions_.find(function);
    if (it == functions_.end()) return NotRegistered(function);
    Function& f = it->second;
    def = f.def;
    for (HostId h : hosts) {
      if (f.loaded_on.contains(h)) continue;
      WorkerInterface* w = members_.Worker(h);
      if (w == nullptr)
        f.loaded_on.insert(h);  // JoinHost loads it.
      else if (std::find(workers.begin(), workers.end(), w) == workers.end())
        workers.push_back(w);
    }
  }
  std::vector<Future<>> loads;  // In parallel; each RPC has its deadline.
  for (WorkerInterface* w : workers) loads.push_back(w->LoadFunction(function, def));
  absl::Status first;
  for (size_t i = 0; i < workers.size(); ++i) {
    absl::Status s = loads[i].Await();
    first.Update(s);
    if (!s.ok()) continue;
    pw::MutexLock lock(&mu_);
    if (auto it = functions_.find(function); it != functions_.end())  // Not freed meanwhile.
      it->second.loaded_on.insert(workers[i]->host());
  }
  return first;
}

absl::StatusOr<FunctionSignature> Controller::Signature(ClientId client, FunctionId id,
                                                       int num_shards) {
  pw::MutexLock lock(&mu_);
  // Another client's function reads as one that does not exist: ids reveal nothing.
  auto found = functions_.find(id);
  if (found == functions_.end() || found->second.owner != client) return NotRegistered(id);
  const Function& f = found->second;
  auto key = std::make_pair(id, num_shards);
  auto it = signatures_.find(key);
  if (it != signatures_.end()) return it->second;
  PW_ASSIGN_OR_RETURN(FunctionSignature sig, SignatureOf(f.def, num_shards));
  signatures_.emplace(key, sig);
  return sig;
}

absl::StatusOr<std::vector<ArraySpec>> Controller::LoadFunction(ClientId client,
                                                                FunctionId function,
                                                                SliceId slice) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  PW_ASSIGN_OR_RETURN(SliceInfo s, rm_.ResolveSlice(client, slice));
  PW_ASSIGN_OR_RETURN(FunctionSignature sig,
                      Signature(client, function, static_cast<int>(s.devices.size())));
  PW_RETURN_IF_ERROR(CheckSpmdPlacement(function, s.hosts, s.id.ToString()));
  PW_RETURN_IF_ERROR(CheckIntermediatesFit(sig, s.devices, s.id.ToString()));
  PW_RETURN_IF_ERROR(LoadOnHosts(function, s.hosts));
  return sig.outputs;
}

absl::Status Controller::CheckIntermediatesFit(const FunctionSignature& sig,
                                              absl::Span<const DeviceId> devices,
                                              const std::string& where) const {
  if (sig.temp_bytes == 0) return absl::OkStatus();
  for (DeviceId d : devices) {
    PW_ASSIGN_OR_RETURN(DeviceSpec spec, rm_.Device(d));
    if (sig.temp_bytes > spec.memory_bytes)
      return absl::ResourceExhaustedError(absl::StrCat(
          "function '", sig.name, "' needs ", sig.temp_bytes, " bytes on ", d.ToString(), " of ",
          where, " for its intermediate values while a shard runs, but the device has only ",
          spec.memory_bytes, " bytes: it can never run there"));
  }
  return absl::OkStatus();
}

absl::Status Controller::CheckSpmdPlacement(FunctionId function, const std::vector<HostId>& hosts,
                                            const std::string& where) const {
  const size_t num_hosts = absl::flat_hash_set<HostId>(hosts.begin(), hosts.end()).size();
  if (num_hosts <= 1) return absl::OkStatus();
  pw::MutexLock lock(&mu_);
  auto it = functions_.find(function);
  if (it == functions_.end()) return NotRegistered(function);
  const auto* hlo = std::get_if<StableHloFunctionDef>(&it->second.def);
  if (hlo == nullptr || hlo->num_partitions <= 1) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "function '", hlo->name, "' is an SPMD XLA module of ", hlo->num_partitions,
      " partitions, which meet in XLA's in-process collectives, but ", where, " spans ",
      num_hosts, " hosts (worker processes, each with its own PJRT client): export it per shard "
      "with runtime collectives (pw.pmap with "
      "axis_name=, StableHloFunctionDef::collective_axis_size) or ask for a one-host slice "
      "(placement=host)"));
}

absl::StatusOr<std::shared_ptr<const Controller::Plan>> Controller::BuildPlan(
    ClientId client, const ProgramIr& ir, const std::vector<Placement>& args) {
  Lowering ctx(this, client);
  PW_ASSIGN_OR_RETURN(LoweredProgram lowered, Lower(ir, args, ctx));
  for (const auto& [device, bytes] : lowered.device_bytes) {
    PW_ASSIGN_OR_RETURN(DeviceSpec d, rm_.Device(device));
    if (bytes > d.memory_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "program '", lowered.name, "' needs ", bytes, " bytes on ", device.ToString(),
          " for the values it produces, but the device has only ", d.memory_bytes,
          " bytes; it can never fit"));
    }
  }
  auto plan = std::make_shared<Plan>();
  absl::flat_hash_map<HostId, IslandId> host_island = members_.HostIslands();
  // Every host the plan touches must have joined (a host the resource manager knows may not have
  // attached its worker yet).
  for (const LoweredNode& n : lowered.nodes) {
    for (HostId h : n.slice.hosts) {
      if (!host_island.contains(h))
        return absl::UnavailableError(absl::StrCat("program '", lowered.name, "' node '", n.name,
                                                   "': ", h.ToString(), " has not joined yet"));
    }
    if (n.kind == LoweredNode::Kind::kCompute) {
      const std::string slice =
          absl::StrCat("program '", lowered.name, "' node '", n.name, "''s slice");
      PW_RETURN_IF_ERROR(CheckSpmdPlacement(n.function, n.slice.hosts, slice));
      // Bound to another slice, a function may have other intermediates here (per shard count).
      PW_ASSIGN_OR_RETURN(
          FunctionSignature sig,
          Signature(client, n.function, static_cast<int>(n.slice.devices.size())));
      PW_RETURN_IF_ERROR(CheckIntermediatesFit(sig, n.slice.devices, slice));
      PW_RETURN_IF_ERROR(Annotate(EnsureLoadedOn(n.function, n.slice.hosts),
                                  absl::StrCat("program '", lowered.name, "' node '", n.name, "'")));
    }
  }
  // island -> host -> that host's nodes, in topological order.
  std::map<int64_t, std::map<int64_t, std::shared_ptr<HostProgram>>> islands;
  auto host_program = [&](HostId host) -> HostProgram& {
    auto& p = islands[host_island[host].value()][host.value()];
    if (p == nullptr) {
      static std::atomic<uint64_t> next_host_program{1};
      p = std::make_shared<HostProgram>();
      p->id = next_host_program.fetch_add(1, std::memory_order_relaxed);
      p->program = lowered.name;
    }
    return *p;
  };
  absl::flat_hash_map<int64_t, bool> slices;
  absl::flat_hash_map<int64_t, absl::flat_hash_set<DeviceId>> island_devices;
  absl::flat_hash_map<int64_t, SliceDevices> slice_devices;  // One list per slice, shared.
  for (size_t i = 0; i < lowered.nodes.size(); ++i) {
    const LoweredNode& n = lowered.nodes[i];
    if (n.kind != LoweredNode::Kind::kCompute && n.kind != LoweredNode::Kind::kTransfer) continue;
    std::map<int64_t, std::vector<int>> ranks_by_host;
    for (size_t r = 0; r < n.slice.devices.size(); ++r)
      ranks_by_host[n.slice.hosts[r].value()].push_back(static_cast<int>(r));
    slices[n.slice.slice.value()] = true;
    if (n.kind == LoweredNode::Kind::kCompute && !n.slice.hosts.empty())
      island_devices[host_island[n.slice.hosts[0]].value()].insert(n.slice.devices.begin(),
                                                                    n.slice.devices.end());
    for (const auto& [host, ranks] : ranks_by_host) {
      NodeWork nw{static_cast<int32_t>(i), n.name, {}};
      if (n.kind == LoweredNode::Kind::kCompute) {
        SliceDevices& devices = slice_devices[n.slice.slice.value()];
        if (devices == nullptr)
          devices = std::make_shared<const std::vector<DeviceId>>(n.slice.devices);
        nw.work = ComputeWork{n.function, devices, ranks, n.inputs, n.outputs, n.release};
      } else {
        const Placement& src = *lowered.values[n.inputs[0]].placement;
        const Placement& dst = *lowered.values[n.outputs[0]].placement;
        nw.work = TransferWork{n.inputs[0], n.outputs[0], dst.global, src.sharding, src.devices,
                               src.hosts, dst.sharding, dst.devices, ranks, n.link};
      }
      host_program(HostId(host)).nodes.push_back(std::move(nw));
    }
  }
  for (auto& [island, hosts] : islands) {
    auto& entry = plan->islands.emplace_back(IslandId(island), std::vector<std::pair<HostId, std::shared_ptr<const HostProgram>>>{});
    for (auto& [host, program] : hosts) entry.second.emplace_back(HostId(host), std::move(program));
    plan->island_devices.push_back(static_cast<int>(island_devices[island].size()));
  }
  for (const auto& [s, _] : slices) plan->slices.push_back(SliceId(s));
  plan->output_refs.assign(lowered.values.size(), 0);
  for (int v : lowered.outputs) plan->output_refs[v]++;
  plan->released.assign(lowered.values.size(), false);
  for (const LoweredNode& n : lowered.nodes)
    for (int v : n.release) plan->released[v] = true;
  plan->num_released = std::count(plan->released.begin(), plan->released.end(), true);
  for (size_t v = 0; v < lowered.values.size(); ++v)
    if (lowered.values[v].arg < 0 && !plan->released[v])
      plan->listed_bytes += PlacedBytes(*lowered.values[v].placement);
  plan->lowered = std::move(lowered);
  return std::shared_ptr<const Plan>(std::move(plan));
}

absl::StatusOr<ProgramId> Controller::RegisterProgram(ClientId client, const ProgramIr& ir) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  const std::string prog = absl::StrCat("program '", ir.name.empty() ? "program" : ir.name, "'");
  if (static_cast<int64_t>(ir.nodes.size()) > options_.max_program_nodes)
    return absl::ResourceExhaustedError(absl::StrCat(
        prog, " has ", ir.nodes.size(), " nodes, more than this cluster's limit of ",
        options_.max_program_nodes, " (pw controller --max-program-nodes raises it)"));
  if (programs_.Full(client)) return TooManyPrograms(prog, programs_.FullError(client));
  // Validate with each argument placed where its first consumer wants it.
  std::vector<Placement> args(ir.args.size());
  std::vector<bool> placed(ir.args.size(), false);
  for (const auto& node : ir.nodes) {
    for (size_t j = 0; j < node.inputs.size(); ++j) {
      const ValueRef& r = node.inputs[j];
      if (r.node != ValueRef::kArgNode || r.index < 0 ||
          r.index >= static_cast<int>(args.size()) || placed[r.index])
        continue;
      if (j >= node.binding.in_global.size() || j >= node.binding.in_sharding.size()) continue;
      auto slice = rm_.ResolveSlice(client, node.binding.slice);
      if (!slice.ok()) return Annotate(slice.status(), absl::StrCat(prog, " node '", node.name, "'"));
      args[r.index] = PlacementOn(*slice, ir.args[r.index], node.binding.in_sharding[j]);
      placed[r.index] = true;
    }
  }
  for (size_t i = 0; i < placed.size(); ++i) {
    if (!placed[i])
      return absl::InvalidArgumentError(absl::StrCat(prog, " argument ", i, " is never used"));
  }
  PW_ASSIGN_OR_RETURN(auto plan, BuildPlan(client, ir, args));
  absl::StatusOr<ProgramId> id = programs_.Add(client, ir, LayoutKey(args), std::move(plan));
  if (!id.ok()) return TooManyPrograms(prog, id.status());
  return id;
}

absl::Status Controller::TooManyPrograms(const std::string& prog, const absl::Status& full) {
  return absl::ResourceExhaustedError(absl::StrCat(
      prog, " was not registered: ", full.message(), " (pw controller --max-client-programs); "
      "its programs are freed when it disconnects"));
}

absl::StatusOr<std::shared_ptr<const Controller::Plan>> Controller::PlanFor(
    ClientId client, ProgramId id, const std::vector<Placement>& args) {
  const std::string key = LayoutKey(args);
  std::optional<ProgramCache<Plan>::Found> found = programs_.Find(client, id, key);
  if (!found.has_value()) return NotRegistered(id);
  if (const std::shared_ptr<const Plan>& cached = found->plan; cached != nullptr) {
    // Lowered before: only check that its slices are still usable (not released, no device
    // removed since).
    for (SliceId slice : cached->slices) {
      absl::Status s = rm_.ResolveSlice(client, slice).status();
      if (!s.ok()) return Annotate(s, absl::StrCat("program '", cached->lowered.name, "'"));
    }
    return cached;
  }
  PW_ASSIGN_OR_RETURN(auto plan, BuildPlan(client, found->ir, args));
  std::optional<std::shared_ptr<const Plan>> lru = programs_.Keep(client, id, key, plan);
  if (!lru.has_value()) return NotRegistered(id);  // Its client left meanwhile.
  // The least recently used layout's plan went, and the workers' copies go with it (runs that
  // hold it keep it; a later run of that layout is lowered again).
  absl::flat_hash_map<HostId, std::vector<uint64_t>> evicted;
  if (*lru != nullptr) AddHostPrograms(**lru, evicted);
  for (const auto& [host, programs] : evicted)
    if (WorkerInterface* w = Worker(host)) w->Unload({}, programs);
  return plan;
}

absl::StatusOr<std::string> Controller::ExplainProgram(ClientId client, ProgramId id) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  std::shared_ptr<const Plan> plan = programs_.AnyPlan(client, id);
  if (plan == nullptr) return NotRegistered(id);
  return plan->lowered.ToString();
}

std::pair<Future<absl::Time>, Future<>> Controller::HandToSchedulers(
    std::vector<std::pair<IslandId, IslandWork>> works) {
  std::vector<Future<absl::Time>> enqueued;
  std::vector<Future<>> done;
  // Islands that were idle: their requests are dispatched by this thread, once submit_mu_ is
  // released (each holds its island's dispatch token, so its place in the order is taken).
  std::vector<IslandScheduler::InlineDispatch> now(works.size());
  {
    // One order over every island: runs spanning islands reach each scheduler in it (`seq`).
    pw::MutexLock order(&submit_mu_);
    const int64_t seq = next_seq_++;
    for (size_t i = 0; i < works.size(); ++i) {
      auto& [island, w] = works[i];
      w.seq = seq;
      IslandScheduler* scheduler = Scheduler(island);
      if (scheduler == nullptr) {
        enqueued.push_back(Future<absl::Time>::Ready(absl::Now()));
        done.push_back(Future<>::Ready(
            absl::UnavailableError(absl::StrCat(island.ToString(), " has no scheduler"))));
        continue;
      }
      DispatchAck ack = scheduler->Submit(std::move(w), &now[i]);
      enqueued.push_back(std::move(ack.enqueued));
      done.push_back(AsStatusFuture(ack.done));
    }
  }
  for (IslandScheduler::InlineDispatch& d : now) d.Run();
  return {LatestOf(enqueued), JoinFutures(done)};
}

Future<RunInfo> Controller::Submit(ClientId client, ProgramId program,
                                   const std::vector<BufferId>& args, const RunOptions& options) {
  absl::StatusOr<ClientRegistry::Visit> visit = clients_.Enter(client);  // Ends last.
  if (!visit.ok()) return Future<RunInfo>::Ready(visit.status());
  const std::shared_ptr<const Tenant>& tenant = visit->tenant();
  const DispatchMode mode = options.mode;
  const absl::Time submitted = absl::Now();
  trace::Span span(trace::ControllerTrack(client), "submit", "submit", client.value());
  const absl::Duration timeout =
      options.timeout > absl::ZeroDuration() ? options.timeout : options_.default_run_timeout;
  // Read before the arguments are looked up: a host that fails after this gets none of the run
  // (even from a new worker); one that failed before has lost arrays the lookups refuse.
  const uint64_t membership = members_.epoch();
  // Arguments are pinned as they are looked up, so a concurrent release cannot free them before
  // the run is dispatched; the run unpins them when it finishes.
  std::vector<Placement> placements;
  std::vector<BufferId> pinned;
  // Other clients' arrays still being made: the run reaches the schedulers once they are ready
  // (the policies order only each client's own runs: pw/scheduler/scheduling_policy.h).
  std::vector<Future<>> foreign_pending;
  auto fail = [&](const absl::Status& s) {
    Free(buffers_.Unpin(pinned));
    // Calls already sent with these outputs as arguments fail with the reason.
    if (!options.outputs.empty()) {
      output_ids_.Burn(client, options.outputs);
      output_ids_.Failed(client, options.outputs, s);
    }
    return Future<RunInfo>::Ready(s);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    auto lb = buffers_.LookupAndPin(client, args[i]);
    if (!lb.ok())
      return fail(Annotate(NotMade(client, args[i], lb.status()),
                           absl::StrCat(program.ToString(), " argument ", i)));
    pinned.push_back(args[i]);
    const std::string where = absl::StrCat(program.ToString(), " argument ", i);
    if (lb->owner != client) {  // Shared with it: another client's slice (which may be gone).
      if (absl::Status s = rm_.CheckAlive(lb->placement->devices, where); !s.ok()) return fail(s);
      placements.push_back(*lb->placement);
      if (!lb->ready.IsReady()) foreign_pending.push_back(lb->ready);
      continue;
    }
    auto slice = rm_.ResolveSlice(client, lb->placement->slice);
    if (!slice.ok()) return fail(Annotate(slice.status(), where));
    placements.push_back(PlacementOn(*slice, lb->placement->global, lb->placement->sharding));
  }
  auto plan_or = PlanFor(client, program, placements);
  if (!plan_or.ok()) return fail(plan_or.status());
  const Plan& plan = **plan_or;
  const LoweredProgram& lp = plan.lowered;
  absl::StatusOr<absl::flat_hash_map<int, BufferId>> chosen =
      ChosenOutputs(client, lp, options.outputs);
  if (!chosen.ok()) return fail(Annotate(chosen.status(), program.ToString()));
  if (absl::Status s = ChargeQuota(client, plan.listed_bytes,
                                   absl::StrCat("a run of program '", lp.name, "'"));
      !s.ok())
    return fail(s);

  const RunManager::Started started = runs_.Start(client, lp.name, timeout);
  const RunId run = started.run;
  const Future<> run_done_f = started.done;
  // Allocate every buffer the run produces; outputs get client handles, all get a run pin.
  std::vector<BufferId> ids(lp.values.size());
  std::vector<BufferId> unpin;
  // Intermediates the hosts delete themselves (at their last readers) get ids but no entries.
  int64_t next_released = buffers_.NewIds(plan.num_released).value();
  for (size_t v = 0; v < lp.values.size(); ++v) {
    const LoweredValue& val = lp.values[v];
    if (val.arg >= 0) {
      ids[v] = args[val.arg];
    } else if (plan.released[v]) {
      ids[v] = BufferId(next_released++);
    } else {
      auto c = chosen->find(static_cast<int>(v));
      ids[v] = buffers_.Create({c == chosen->end() ? BufferId() : c->second, client,
                                val.placement, run_done_f},
                               plan.output_refs[v], /*pins=*/1, PlacedBytes(*val.placement));
      unpin.push_back(ids[v]);
    }
  }
  unpin.insert(unpin.end(), pinned.begin(), pinned.end());

  if (span.active()) {
    span.Arg("run", run.value()).Arg("program", lp.name).Arg("tenant", tenant->name());
    span.Arg("nodes", static_cast<int64_t>(lp.nodes.size()));
    if (options.trace_flow != 0) span.FlowIn(options.trace_flow);
    for (const auto& [island, hosts] : plan.islands)
      span.FlowOut(trace::FlowId(run.value(), trace::Stage::kSchedule, island.value()));
  }
  RunInfo info;
  info.run = run;
  info.done = run_done_f;
  for (int v : lp.outputs) {
    const Placement& p = *lp.values[v].placement;
    info.outputs.push_back({ids[v], p.global, p.sharding, p.slice, p.devices, p.hosts});
  }

  auto buffers = std::make_shared<const std::vector<BufferId>>(std::move(ids));
  std::vector<std::pair<IslandId, IslandWork>> works;
  for (size_t i = 0; i < plan.islands.size(); ++i) {
    const auto& [island, hosts] = plan.islands[i];
    works.emplace_back(island, IslandWork{run, client, tenant, lp.name, mode, buffers, hosts, 0,
                                          plan.islands.size() > 1, plan.island_devices[i],
                                          membership});
  }
  Future<absl::Time> enqueued;
  Future<> done;
  ClientRegistry::HandOff hand_off = clients_.Queue(client, JoinFutures(foreign_pending));
  if (!hand_off.handed.has_value()) {
    std::tie(enqueued, done) = HandToSchedulers(std::move(works));
  } else {
    Promise<absl::Time> all_enqueued;
    Promise<> all_done;
    enqueued = all_enqueued.future();
    done = all_done.future();
    hand_off.go.OnReady([this, works = std::move(works), handed = std::move(*hand_off.handed),
                         all_enqueued = std::move(all_enqueued),
                         all_done = std::move(all_done)](const absl::Status&) mutable {
      // Handed over whatever the wait's outcome: a failed input fails the run where it is read.
      auto [e, d] = HandToSchedulers(std::move(works));
      handed.Set();
      e.OnReady([p = std::move(all_enqueued)](const absl::StatusOr<absl::Time>& t) mutable {
        p.Set(t);
      });
      d.OnReady([p = std::move(all_done)](const absl::Status& s) mutable { p.Set(s); });
    });
  }
  done.OnReady([this, run, unpin = std::move(unpin), plan = *plan_or,
                             buffers](const absl::Status& s) mutable {
    completions_.Post([this, run, unpin = std::move(unpin), plan = std::move(plan),
                       buffers = std::move(buffers), s]() mutable {
      FinishRun(run, unpin, *plan, *buffers, s);
    });
  });
  // Accepted now: the client need not wait for the hosts' acks (errors of enqueued work surface
  // through info.done).
  if (options_.on_run_enqueued) {
    enqueued.OnReady([this, submitted](const absl::StatusOr<absl::Time>& at) {
      if (at.ok()) options_.on_run_enqueued(*at - submitted);
    });
  }
  return Future<RunInfo>::Ready(std::move(info));
}

absl::StatusOr<absl::flat_hash_map<int, BufferId>> Controller::ChosenOutputs(
    ClientId client, const LoweredProgram& lp, const std::vector<BufferId>& outputs) {
  absl::flat_hash_map<int, BufferId> chosen;  // By lowered value.
  if (outputs.empty()) return chosen;
  if (outputs.size() != lp.outputs.size())
    return absl::InvalidArgumentError(absl::StrCat("program '", lp.name, "' has ",
                                                   lp.outputs.size(), " outputs, but ",
                                                   outputs.size(), " output ids were given"));
  std::vector<BufferId> distinct;
  for (size_t o = 0; o < outputs.size(); ++o) {
    auto [it, inserted] = chosen.emplace(lp.outputs[o], outputs[o]);
    if (inserted) {
      distinct.push_back(outputs[o]);
    } else if (it->second != outputs[o]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output ", o, " of program '", lp.name, "' is the same value as an earlier output: "
          "give both the same id"));
    }
  }
  PW_RETURN_IF_ERROR(output_ids_.Claim(client, distinct));
  return chosen;
}

absl::Status Controller::NotMade(ClientId client, BufferId id, const absl::Status& missing) const {
  std::optional<absl::Status> why = output_ids_.FailureOf(client, id);
  if (!why.has_value()) return missing;
  return Annotate(*why, absl::StrCat(id.ToString(), " was not made: the run that was to make it "
                                                    "failed"));
}

absl::StatusOr<BufferId> Controller::ReserveBufferIds(ClientId client, int64_t count) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  PW_RETURN_IF_ERROR(output_ids_.CheckLease(client, count));
  const BufferId first = buffers_.NewIds(count);
  PW_RETURN_IF_ERROR(output_ids_.Lease(client, first, count));
  return first;
}

absl::Status Controller::ChargeQuota(ClientId client, int64_t bytes, const std::string& what) {
  PW_ASSIGN_OR_RETURN(ClientRegistry::Quota tenant, clients_.QuotaOf(client));
  const BufferTable::Quota quota{options_.max_client_bytes, tenant.tenant, tenant.bytes};
  switch (buffers_.TryCharge(client, bytes, quota)) {
    case BufferTable::Over::kNothing:
      return absl::OkStatus();
    case BufferTable::Over::kClientQuota:
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " needs ", bytes, " bytes of arrays on the cluster, but ", client.ToString(),
          " already holds ", buffers_.HeldBytes(client), " of its quota of ",
          options_.max_client_bytes,
          " bytes: release arrays it no longer needs (pw controller --max-client-bytes raises it)"));
    case BufferTable::Over::kTenantQuota:
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " needs ", bytes, " bytes of arrays on the cluster, but tenant '", tenant.name,
          "' (", client.ToString(), "'s) already holds ", buffers_.TenantHeldBytes(tenant.tenant),
          " of its quota of ", tenant.bytes,
          " bytes: release arrays its clients no longer need (pw tenant set ", tenant.name,
          " --memory BYTES raises it)"));
  }
  return absl::OkStatus();
}

void Controller::FinishRun(RunId run, const std::vector<BufferId>& unpin, const Plan& plan,
                           const std::vector<BufferId>& ids, const absl::Status& s) {
  Free(buffers_.Unpin(unpin));
  if (!s.ok()) {
    // A failed run's readers may not have run: then its intermediates are still on their hosts.
    std::vector<LogicalBuffer> intermediates;
    for (size_t v = 0; v < plan.released.size(); ++v)
      if (plan.released[v])
        intermediates.push_back({ids[v], ClientId(), plan.lowered.values[v].placement, {}});
    Free(intermediates);
  }
  runs_.Finish(run, s);
}

void Controller::Free(const std::vector<LogicalBuffer>& freed) {
  if (freed.empty()) return;
  absl::flat_hash_map<HostId, std::vector<BufferId>> by_host;
  for (const auto& b : freed) {
    for (HostId h : b.placement->hosts) {
      auto& v = by_host[h];
      if (v.empty() || v.back() != b.id) v.push_back(b.id);
    }
  }
  for (auto& [h, ids] : by_host) {
    if (WorkerInterface* w = Worker(h)) w->DeleteBuffers(ids);
  }
}

absl::StatusOr<ArrayInfo> Controller::NewPutArray(ClientId client, SliceId slice_id,
                                                  const Sharding& sharding, const ArraySpec& spec,
                                                  Future<> ready) {
  PW_ASSIGN_OR_RETURN(SliceInfo slice, rm_.ResolveSlice(client, slice_id));
  PW_RETURN_IF_ERROR(spec.Validate());
  PW_RETURN_IF_ERROR(sharding.Validate(spec.shape));
  if (sharding.num_devices() != static_cast<int>(slice.devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat("sharding ", sharding.ToString(), " covers ",
                                                   sharding.num_devices(), " devices but ",
                                                   slice_id.ToString(), " has ",
                                                   slice.devices.size()));
  }
  auto placement = std::make_shared<const Placement>(PlacementOn(slice, spec, sharding));
  const int64_t bytes = PlacedBytes(*placement);
  PW_RETURN_IF_ERROR(ChargeQuota(client, bytes, absl::StrCat("a put of ", spec.ToString())));
  BufferId id = buffers_.Create({BufferId(), client, placement, std::move(ready)},
                                /*client_refs=*/1, /*pins=*/0, bytes);
  return ArrayInfo{id, spec, sharding, slice_id, slice.devices, slice.hosts};
}

absl::StatusOr<ArrayInfo> Controller::PutArray(ClientId client, SliceId slice_id,
                                               const Sharding& sharding, HostArray value) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  PW_RETURN_IF_ERROR(value.spec.Validate());
  if (static_cast<int64_t>(value.bytes.size()) != value.spec.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("array ", value.spec.ToString(), " needs ",
                                                   value.spec.size_bytes(), " bytes, got ",
                                                   value.bytes.size()));
  }
  Promise<> ready;
  PW_ASSIGN_OR_RETURN(ArrayInfo info,
                      NewPutArray(client, slice_id, sharding, value.spec, ready.future()));
  const Box whole{std::vector<int64_t>(value.spec.shape.rank(), 0),
                  std::vector<int64_t>(value.spec.shape.dims().begin(), value.spec.shape.dims().end())};
  const ArraySpec shard_spec{value.spec.dtype, sharding.ShardShape(value.spec.shape)};
  // Every shard is cut before any is sent, and the whole array freed then (a shard covering it,
  // the last, takes its bytes): one more copy of a large put at most, not one per hop.
  std::vector<HostArray> shards(info.devices.size());
  for (size_t r = 0; r < shards.size(); ++r) {
    const Box box = sharding.ShardBox(value.spec.shape, static_cast<int>(r));
    if (r + 1 == shards.size() && box == whole) {
      shards[r] = HostArray{shard_spec, std::move(value.bytes)};
      break;
    }
    shards[r] = HostArray{shard_spec, Bytes(shard_spec.size_bytes())};
    CopyBoxIntersection(value.bytes.data(), whole, shards[r].bytes.data(), box,
                        DTypeSize(value.spec.dtype));
  }
  Bytes().swap(value.bytes);
  std::vector<Future<>> puts;
  for (size_t r = 0; r < shards.size(); ++r) {
    WorkerInterface* w = Worker(info.hosts[r]);
    puts.push_back(w == nullptr ? Future<>::Ready(NoWorker(info.hosts[r]))
                                : w->PutShard(info.id, info.devices[r], std::move(shards[r])));
  }
  JoinFutures(puts).OnReady([ready = std::move(ready)](const absl::Status& s) mutable { ready.Set(s); });
  return info;
}

Future<DirectPut> Controller::BeginPut(ClientId client, SliceId slice_id, const Sharding& sharding,
                                       const ArraySpec& spec) {
  absl::StatusOr<ClientRegistry::Visit> visit = clients_.Enter(client);
  if (!visit.ok()) return Future<DirectPut>::Ready(visit.status());
  Promise<> ready;
  absl::StatusOr<ArrayInfo> info = NewPutArray(client, slice_id, sharding, spec, ready.future());
  if (!info.ok()) return Future<DirectPut>::Ready(info.status());
  const ArraySpec shard_spec{spec.dtype, sharding.ShardShape(spec.shape)};
  std::vector<Future<>> stored;
  auto accepted = std::make_shared<std::vector<Future<ShardTransfer>>>();
  std::vector<Future<>> deps;
  for (size_t r = 0; r < info->devices.size(); ++r) {
    WorkerInterface* w = Worker(info->hosts[r]);
    UploadAck ack = w == nullptr ? UploadAck{Future<ShardTransfer>::Ready(NoWorker(info->hosts[r])),
                                             Future<>::Ready(NoWorker(info->hosts[r]))}
                                 : w->ExpectUpload(info->id, info->devices[r], shard_spec);
    stored.push_back(ack.stored);
    accepted->push_back(ack.accepted);
    deps.push_back(AsStatusFuture(ack.accepted));
  }
  JoinFutures(stored).OnReady([ready = std::move(ready)](const absl::Status& s) mutable { ready.Set(s); });
  Promise<DirectPut> answer;
  Future<DirectPut> result = answer.future();
  JoinFutures(deps).OnReady([this, client, info = *info, accepted,
                             answer = std::move(answer)](const absl::Status& s) mutable {
    if (!s.ok()) {
      // The client never learns the array: it goes now (its shards fail with `s`).
      (void)ReleaseArray(client, info.id);
      return answer.Set(s);
    }
    DirectPut put{info, {}};
    for (size_t r = 0; r < accepted->size(); ++r) {
      put.shards.push_back(*(*accepted)[r].Await());
      put.shards.back().rank = static_cast<int>(r);
    }
    answer.Set(std::move(put));
  });
  return result;
}

Future<LocatedArray> Controller::LocateArray(ClientId client, BufferId id, bool inline_only) {
  absl::StatusOr<ClientRegistry::Visit> visit = clients_.Enter(client);
  if (!visit.ok()) return Future<LocatedArray>::Ready(visit.status());
  auto lb = buffers_.LookupAndPin(client, id);
  if (!lb.ok()) return Future<LocatedArray>::Ready(NotMade(client, id, lb.status()));
  std::shared_ptr<const Placement> pl = lb->placement;
  Promise<LocatedArray> answer;
  Future<LocatedArray> result = answer.future();
  if (inline_only || pl->global.size_bytes() < kDirectIoMinBytes) {
    FetchPinned(id, pl, lb->ready)
        .OnReady([this, id, pl, answer = std::move(answer)](
                     const absl::StatusOr<HostArray>& a) mutable {
          Free(buffers_.Unpin({id}));
          if (!a.ok()) return answer.Set(a.status());
          answer.Set(LocatedArray{*a, pl->global, pl->sharding, {}});
        });
    return result;
  }
  lb->ready.OnReady([this, id, pl, answer = std::move(answer)](const absl::Status& s) mutable {
    if (!s.ok()) {
      Free(buffers_.Unpin({id}));
      return answer.Set(s);
    }
    // One offer per distinct region (replicated shardings repeat regions).
    std::vector<Box> boxes;
    std::vector<int> ranks;
    auto offers = std::make_shared<std::vector<Future<ShardTransfer>>>();
    std::vector<Future<>> deps;
    for (size_t r = 0; r < pl->devices.size(); ++r) {
      Box b = pl->sharding.ShardBox(pl->global.shape, static_cast<int>(r));
      if (std::find(boxes.begin(), boxes.end(), b) != boxes.end()) continue;
      boxes.push_back(std::move(b));
      ranks.push_back(static_cast<int>(r));
      WorkerInterface* w = Worker(pl->hosts[r]);
      offers->push_back(w == nullptr ? Future<ShardTransfer>::Ready(NoWorker(pl->hosts[r]))
                                     : w->OfferShard(id, pl->devices[r]));
      deps.push_back(AsStatusFuture(offers->back()));
    }
    // Unpinned once offered: each worker holds its shard for the client until read.
    JoinFutures(deps).OnReady([this, id, pl, ranks = std::move(ranks), offers,
                               answer = std::move(answer)](const absl::Status& s) mutable {
      Free(buffers_.Unpin({id}));
      if (!s.ok()) return answer.Set(s);
      LocatedArray out{std::nullopt, pl->global, pl->sharding, {}};
      for (size_t i = 0; i < offers->size(); ++i) {
        out.shards.push_back(*(*offers)[i].Await());
        out.shards.back().rank = ranks[i];
      }
      answer.Set(std::move(out));
    });
  });
  return result;
}

Future<HostArray> Controller::FetchArray(ClientId client, BufferId id) {
  absl::StatusOr<ClientRegistry::Visit> visit = clients_.Enter(client);
  if (!visit.ok()) return Future<HostArray>::Ready(visit.status());
  // Pinned until the copy is done, so releasing the handle meanwhile cannot free the shards.
  auto lb = buffers_.LookupAndPin(client, id);
  if (!lb.ok()) return Future<HostArray>::Ready(NotMade(client, id, lb.status()));
  Promise<HostArray> fetched;
  Future<HostArray> result = fetched.future();
  Future<HostArray> inner = FetchPinned(id, lb->placement, lb->ready);
  inner.OnReady([this, id, fetched = std::move(fetched)](const absl::StatusOr<HostArray>& r) mutable {
    Free(buffers_.Unpin({id}));
    fetched.Set(r);
  });
  return result;
}

Future<HostArray> Controller::FetchPinned(BufferId id, std::shared_ptr<const Placement> placement,
                                          Future<> ready) {
  Promise<HostArray> p;
  Future<HostArray> result = p.future();
  ready.OnReady([this, id, pl = std::move(placement), p = std::move(p)](const absl::Status& s) mutable {
    if (!s.ok()) return p.Set(s);
    // One shard per distinct region (replicated shardings repeat regions).
    std::vector<int> ranks;
    std::vector<Box> boxes;
    for (size_t r = 0; r < pl->devices.size(); ++r) {
      Box b = pl->sharding.ShardBox(pl->global.shape, static_cast<int>(r));
      if (std::find(boxes.begin(), boxes.end(), b) != boxes.end()) continue;
      boxes.push_back(b);
      ranks.push_back(static_cast<int>(r));
    }
    std::vector<Future<DeviceBufferRef>> shards;
    std::vector<Future<>> deps;
    for (int r : ranks) {
      WorkerInterface* w = Worker(pl->hosts[r]);
      shards.push_back(w == nullptr ? Future<DeviceBufferRef>::Ready(absl::UnavailableError(
                                          absl::StrCat(pl->hosts[r].ToString(), " has no worker")))
                                    : w->FetchShard(id, pl->devices[r]));
      deps.push_back(AsStatusFuture(shards.back()));
    }
    JoinFutures(deps).OnReady([pl, boxes = std::move(boxes), shards = std::move(shards),
                               p = std::move(p)](const absl::Status& s) mutable {
      if (!s.ok()) return p.Set(s);
      const ArraySpec& g = pl->global;
      HostArray out{g, Bytes(g.size_bytes())};
      const Box whole{std::vector<int64_t>(g.shape.rank(), 0),
                      std::vector<int64_t>(g.shape.dims().begin(), g.shape.dims().end())};
      for (size_t i = 0; i < shards.size(); ++i) {
        DeviceBufferRef b = *shards[i].Await();
        shards[i] = Future<DeviceBufferRef>();  // This copy holds the shard only until copied.
        if (boxes[i] == whole) {  // One shard is the whole array: no staging copy.
          absl::Status c = b->CopyToHost(out.bytes.data()).status();
          if (!c.ok()) return p.Set(c);
          continue;
        }
        Bytes staged(b->size_bytes());
        absl::Status c = b->CopyToHost(staged.data()).status();
        if (!c.ok()) return p.Set(c);
        CopyBoxIntersection(staged.data(), boxes[i], out.bytes.data(), whole,
                            DTypeSize(g.dtype));
      }
      p.Set(std::move(out));
    });
  });
  return result;
}

Future<> Controller::ArrayReady(ClientId client, BufferId id) {
  absl::StatusOr<ClientRegistry::Visit> visit = clients_.Enter(client);
  if (!visit.ok()) return Future<>::Ready(visit.status());
  auto lb = buffers_.Lookup(client, id);
  if (!lb.ok()) return Future<>::Ready(NotMade(client, id, lb.status()));
  return lb->ready;
}

absl::Status Controller::ReleaseArray(ClientId client, BufferId id) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  auto freed = buffers_.ReleaseHandle(client, id);
  if (!freed.ok() && output_ids_.Forget(client, id)) return absl::OkStatus();  // Never made.
  PW_RETURN_IF_ERROR(freed.status());
  Free(*freed);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Controller::ShareArray(ClientId client, BufferId id,
                                                   const ShareOptions& options) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  PW_RETURN_IF_ERROR(buffers_.Lookup(client, id).status());  // Only what it holds.
  pw::MutexLock lock(&shares_mu_);
  if (options.token.empty()) return shares_.Create(client, id, options.writable);
  PW_RETURN_IF_ERROR(shares_.Repoint(client, options.token, id));
  return options.token;
}

absl::StatusOr<ArrayInfo> Controller::ImportArray(ClientId client, const std::string& token) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  pw::MutexLock lock(&shares_mu_);
  PW_ASSIGN_OR_RETURN(BufferId id, shares_.Import(client, token));
  PW_ASSIGN_OR_RETURN(LogicalBuffer lb, buffers_.AddHandle(client, id));
  const Placement& p = *lb.placement;
  return ArrayInfo{lb.id, p.global, p.sharding, p.slice, p.devices, p.hosts};
}

absl::Status Controller::RevokeShare(ClientId client, const std::string& token) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  std::vector<LogicalBuffer> freed;
  {
    pw::MutexLock lock(&shares_mu_);
    PW_ASSIGN_OR_RETURN(auto imports, shares_.Revoke(client, token));
    for (const auto& [importer, id] : imports) {
      auto lb = buffers_.Lookup(importer, id, /*even_lost=*/true);
      if (!lb.ok() || lb->owner == importer) continue;  // Released already, or its own array.
      for (LogicalBuffer& b : buffers_.DropHandles(importer, id)) freed.push_back(std::move(b));
    }
  }
  Free(freed);
  return absl::OkStatus();
}

Controller::Registry Controller::registry() const {
  pw::MutexLock lock(&mu_);
  Registry r;
  r.functions = functions_.size();
  r.programs = programs_.programs();
  r.plans = programs_.plans();
  r.signatures = signatures_.size();
  r.runs = runs_.size();
  r.traces = traces_.size();
  r.clients = clients_.size();
  r.tenants = clients_.Tenants().size();
  return r;
}

absl::StatusOr<ClusterStatus> Controller::Status() {
  ClusterStatus s;
  Membership::Failed failed;
  const std::vector<Membership::Member> workers = members_.Members(&failed);
  for (auto& [host, reason] : failed) s.failed_hosts.push_back({host, std::move(reason)});
  for (IslandScheduler* sched : members_.Schedulers()) {
    s.scheduler_queue_depth.push_back(sched->queue_depth());
    s.scheduler_round_trip_ns.push_back(absl::ToInt64Nanoseconds(sched->round_trip()));
  }
  RunManager::Counts runs = runs_.Snapshot(ClusterStatus::kMaxRunningListed);
  s.runs_in_flight = static_cast<size_t>(runs.in_flight);
  s.runs_completed = runs.completed;
  s.running = std::move(runs.running);
  std::vector<Future<HostStatus>> asked;  // In parallel; each answers within its deadline.
  for (const Membership::Member& a : workers) asked.push_back(a.worker->Status());
  for (size_t i = 0; i < workers.size(); ++i) {
    const Membership::Member& a = workers[i];
    absl::StatusOr<HostStatus> h = asked[i].Await();
    if (h.ok()) {
      s.hosts.push_back(*std::move(h));
      continue;
    }
    HostStatus& unknown = s.hosts.emplace_back();
    unknown.host = a.host;
    unknown.island = a.island;
    unknown.error = h.status().ToString();
  }
  std::sort(s.hosts.begin(), s.hosts.end(),
            [](const HostStatus& a, const HostStatus& b) { return a.host < b.host; });
  s.logical_buffers = buffers_.size();
  AddTenants(s);
  return s;
}

void Controller::AddTenants(ClusterStatus& s) const {
  s.scheduling = options_.scheduling.policy == "fifo" ? "fifo" : "share";
  absl::flat_hash_map<int64_t, IslandScheduler::TenantLoad> loads;  // Over every island.
  int64_t total_ns = 0;
  {
    for (IslandScheduler* sched : members_.Schedulers()) {
      for (const IslandScheduler::TenantLoad& l : sched->TenantLoads()) {
        IslandScheduler::TenantLoad& sum = loads[l.tenant->id()];
        sum.queued += l.queued;
        sum.device_ns_last_second += l.device_ns_last_second;
        sum.device_ns_total += l.device_ns_total;
        total_ns += l.device_ns_last_second;
      }
    }
  }
  for (const ClientRegistry::TenantInfo& t : clients_.Tenants()) {
    ClusterStatus::Tenant& out = s.tenants.emplace_back();
    out.name = t.tenant->name();
    out.share = t.tenant->share();
    out.pinned = t.pinned;
    out.memory_quota_bytes = t.memory_quota;
    out.memory_bytes = buffers_.TenantHeldBytes(t.tenant->id());
    out.clients = t.clients;
    if (auto it = loads.find(t.tenant->id()); it != loads.end()) {
      out.queued = it->second.queued;
      out.device_seconds = static_cast<double>(it->second.device_ns_total) / 1e9;
      if (total_ns > 0)
        out.achieved_share = static_cast<double>(it->second.device_ns_last_second) / total_ns;
    }
  }
}

}  // namespace pw
