#include "pw/client/client.h"

#include <cstdlib>

#include <algorithm>
#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/program/lowering.h"

namespace pw {

// ---- Array

Array::Handle::~Handle() { controller->ReleaseArray(client, info.id).IgnoreError(); }

const ArrayInfo& Array::Handle::Placed() const {
  if (!run.valid()) return info;
  const absl::StatusOr<RunInfo>& r = run.Await();
  return r.ok() ? r->outputs[output] : info;
}

Future<> Array::Ready() const {
  if (h_->done.valid()) return h_->done;
  return h_->controller->ArrayReady(h_->client, h_->info.id);
}

// The handle lives until the read ends: dropping the Array meanwhile must not free the shards
// being read (a wire client reads them from the workers after the controller answered). It is
// dropped before the result is set, as its last reference may release the array through the
// controller, which whoever waits for the result may destroy next.
Future<HostArray> Array::Fetch(std::shared_ptr<Handle> h) {
  Promise<HostArray> p;
  Future<HostArray> result = p.future();
  h->controller->FetchArray(h->client, h->info.id)
      .OnReady([h = std::move(h), p = std::move(p)](const absl::StatusOr<HostArray>& a) mutable {
        h.reset();
        p.Set(a);
      });
  return result;
}

// Calls about a run's output go after the controller has accepted the run (they do not travel
// in order with it), and fail with the reason if it refused it.
Future<HostArray> Array::ToHostAsync() const {
  if (!h_->run.valid()) return Fetch(h_);
  Promise<HostArray> p;
  Future<HostArray> f = p.future();
  h_->run.OnReady([h = h_, p = std::move(p)](const absl::StatusOr<RunInfo>& r) mutable {
    if (!r.ok()) return p.Set(r.status());
    Fetch(std::move(h))
        .OnReady([p = std::move(p)](const absl::StatusOr<HostArray>& a) mutable { p.Set(a); });
  });
  return f;
}

// Waits for the run's acceptance here rather than chaining on it as ToHostAsync does, and the
// caller's Array holds the handle while it reads: the fetched array is moved out of the
// controller's future, not copied into another.
absl::StatusOr<HostArray> Array::ToHost() const {
  if (h_->run.valid()) PW_RETURN_IF_ERROR(h_->run.status());
  return h_->controller->FetchArray(h_->client, h_->info.id).Take();
}

absl::StatusOr<std::string> Array::Share(const ShareOptions& options) const {
  if (h_->run.valid()) PW_RETURN_IF_ERROR(h_->run.status());
  return h_->controller->ShareArray(h_->client, h_->info.id, options);
}

Future<> Array::Save(const std::string& path) const {
  // As ToHostAsync: after the run is accepted, the handle held until the save ends, and
  // dropped before the caller hears (as Fetch's).
  auto save = [path](std::shared_ptr<Handle> h) {
    Promise<> p;
    Future<> saved = p.future();
    h->controller->SaveArray(h->client, h->info.id, path)
        .OnReady([h = std::move(h), p = std::move(p)](const absl::Status& s) mutable {
          h.reset();
          p.Set(s);
        });
    return saved;
  };
  if (!h_->run.valid()) return save(h_);
  Promise<> p;
  Future<> f = p.future();
  h_->run.OnReady([h = h_, p = std::move(p), save](const absl::StatusOr<RunInfo>& r) mutable {
    if (!r.ok()) return p.Set(r.status());
    save(std::move(h)).OnReady([p = std::move(p)](const absl::Status& s) mutable { p.Set(s); });
  });
  return f;
}

// ---- Slices

absl::Status Slice::Release() const {
  return client_->controller()->ReleaseSlice(client_->id(), info_.id);
}

absl::StatusOr<Slice> VirtualDeviceSet::AddSlice(const SliceRequest& request) {
  PW_ASSIGN_OR_RETURN(SliceInfo info,
                      client_->controller()->AllocateSlice(client_->id(), request));
  slices_.push_back(Slice(client_, info));
  return slices_.back();
}

// ---- Client

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ControllerInterface* controller,
                                                        const std::string& name,
                                                        ConnectOptions options) {
  if (const char* t = std::getenv("PW_TENANT"); options.tenant.empty() && t != nullptr)
    options.tenant = t;
  if (const char* sh = std::getenv("PW_SHARE"); options.share == 0 && sh != nullptr && *sh) {
    if (!absl::SimpleAtod(sh, &options.share))
      return absl::InvalidArgumentError(absl::StrCat("PW_SHARE='", sh, "' is not a number"));
  }
  PW_ASSIGN_OR_RETURN(ClientId id, controller->Connect(name, options));
  return std::unique_ptr<Client>(new Client(controller, id));
}

Client::~Client() {
  {
    pw::MutexLock lock(&trace_mu_);
    if (trace_since_ >= 0) trace::Recorder::Get().Stop();  // The controller's ends with us.
  }
  controller_->Disconnect(id_).IgnoreError();
}

Array Client::Adopt(const ArrayInfo& info) {
  return Array(std::shared_ptr<Array::Handle>(new Array::Handle{controller_, id_, info}));
}

absl::StatusOr<std::vector<BufferId>> Client::TakeOutputIds(int n) {
  std::vector<BufferId> ids;
  ids.reserve(n);
  pw::MutexLock lock(&ids_mu_);
  while (static_cast<int>(ids.size()) < n) {
    if (ids_next_ == ids_end_) {  // This range is used up (none is left half used).
      const int64_t count = std::max<int64_t>(kOutputIdLease, n - static_cast<int64_t>(ids.size()));
      PW_ASSIGN_OR_RETURN(BufferId first, controller_->ReserveBufferIds(id_, count));
      ids_next_ = first.value();
      ids_end_ = first.value() + count;
    }
    ids.push_back(BufferId(ids_next_++));
  }
  return ids;
}

absl::StatusOr<FunctionInfo> Client::Register(const FunctionDef& def) {
  return controller_->RegisterFunction(id_, def);
}

absl::StatusOr<BoundFunction> Client::Pmap(const FunctionDef& def, const Slice& slice) {
  PW_ASSIGN_OR_RETURN(FunctionInfo fn, Register(def));
  return Pmap(fn, slice);
}

absl::StatusOr<BoundFunction> Client::Pmap(const FunctionInfo& fn, const Slice& slice) {
  PW_ASSIGN_OR_RETURN(std::vector<ArraySpec> outs,
                      controller_->LoadFunction(id_, fn.id, slice.info().id));
  const int64_t n = slice.num_devices();
  auto stacked = [n](const std::vector<ArraySpec>& specs, std::vector<ArraySpec>* global,
                     std::vector<Sharding>* sharding) {
    for (const auto& s : specs) {
      std::vector<int64_t> dims{n};
      dims.insert(dims.end(), s.shape.dims().begin(), s.shape.dims().end());
      global->push_back({s.dtype, Shape(dims)});
      sharding->push_back(Sharding::Split({n}, static_cast<int>(dims.size()), 0));
    }
  };
  std::vector<ArraySpec> in_g, out_g;
  std::vector<Sharding> in_s, out_s;
  stacked(fn.inputs, &in_g, &in_s);
  stacked(outs, &out_g, &out_s);
  return BindLoaded(fn, outs, slice, std::move(in_g), std::move(in_s), std::move(out_g),
                    std::move(out_s));
}

absl::StatusOr<BoundFunction> Client::Bind(const FunctionInfo& fn, const Slice& slice,
                                           std::vector<ArraySpec> in_global,
                                           std::vector<Sharding> in_sharding,
                                           std::vector<ArraySpec> out_global,
                                           std::vector<Sharding> out_sharding) {
  PW_ASSIGN_OR_RETURN(std::vector<ArraySpec> outs,
                      controller_->LoadFunction(id_, fn.id, slice.info().id));
  return BindLoaded(fn, outs, slice, std::move(in_global), std::move(in_sharding),
                    std::move(out_global), std::move(out_sharding));
}

absl::StatusOr<BoundFunction> Client::BindLoaded(const FunctionInfo& fn,
                                                 const std::vector<ArraySpec>& outs,
                                                 const Slice& slice,
                                                 std::vector<ArraySpec> in_global,
                                                 std::vector<Sharding> in_sharding,
                                                 std::vector<ArraySpec> out_global,
                                                 std::vector<Sharding> out_sharding) {
  // The layouts are checked here, at binding, as lowering would check them at the first run.
  const std::string where = absl::StrCat("binding function '", fn.name, "' to ",
                                         slice.info().id.ToString());
  if (in_global.size() != fn.inputs.size() || in_sharding.size() != fn.inputs.size() ||
      out_global.size() != outs.size() || out_sharding.size() != outs.size())
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the function takes ", fn.inputs.size(), " inputs and returns ", outs.size(),
        " outputs, but ", in_global.size(), " input and ", out_global.size(),
        " output layouts were given"));
  for (size_t i = 0; i < in_global.size(); ++i)
    PW_RETURN_IF_ERROR(CheckLayout(absl::StrCat(where, ": input ", i), in_global[i],
                                   in_sharding[i], fn.inputs[i], slice.info()));
  for (size_t i = 0; i < out_global.size(); ++i)
    PW_RETURN_IF_ERROR(CheckLayout(absl::StrCat(where, ": output ", i), out_global[i],
                                   out_sharding[i], outs[i], slice.info()));
  auto state = std::make_shared<BoundFunction::State>();
  state->client = this;
  state->name = fn.name;
  state->binding = {fn.id,          slice.info().id,      std::move(in_global),
                    std::move(in_sharding), std::move(out_global), std::move(out_sharding)};
  return BoundFunction(std::move(state));
}

absl::StatusOr<Array> Client::Import(const std::string& token) {
  PW_ASSIGN_OR_RETURN(ArrayInfo info, controller_->ImportArray(id_, token));
  return Adopt(info);
}

absl::Status Client::Revoke(const std::string& token) { return controller_->RevokeShare(id_, token); }

absl::StatusOr<Array> Client::Load(SliceId slice, const Sharding& sharding,
                                   const ArraySpec& spec, const std::string& path) {
  PW_ASSIGN_OR_RETURN(ArrayInfo info, controller_->LoadArray(id_, slice, sharding, spec, path));
  return Adopt(info);
}

absl::StatusOr<std::string> Client::CommitCheckpoint(
    const std::string& path, const std::vector<std::pair<std::string, std::string>>& files,
    const std::string& final_path) {
  return controller_->CommitCheckpoint(id_, path, files, final_path);
}

absl::StatusOr<Array> Client::Put(HostArray value, SliceId slice, const Sharding& sharding) {
  PW_ASSIGN_OR_RETURN(ArrayInfo info, controller_->PutArray(id_, slice, sharding, std::move(value)));
  return Adopt(info);
}

absl::StatusOr<Array> Client::PutFrom(const ArraySpec& spec, absl::Span<const uint8_t> bytes,
                                      SliceId slice, const Sharding& sharding) {
  PW_ASSIGN_OR_RETURN(ArrayInfo info,
                      controller_->PutArrayFrom(id_, slice, sharding, spec, bytes));
  return Adopt(info);
}

// ---- Tracing

namespace {
std::atomic<uint64_t> next_trace{1};
thread_local Tracer* current_trace = nullptr;
}  // namespace

Tracer::Tracer() : id_(next_trace.fetch_add(1, std::memory_order_relaxed)), outer_(current_trace) {
  current_trace = this;
}

Tracer::~Tracer() { current_trace = outer_; }

Tracer* Tracer::Current() { return current_trace; }

void Tracer::Fail(absl::Status s) {
  if (error_.ok()) error_ = std::move(s);
}

Value Tracer::Arg(int index) const {
  return Value(id_, {ValueRef::kArgNode, index}, ir_.args[index]);
}

std::vector<Value> BoundFunction::operator()(const std::vector<Value>& inputs) const {
  const Binding& b = state_->binding;
  Tracer* t = Tracer::Current();
  std::vector<Value> outs;
  if (t == nullptr) return outs;  // Nothing to record into; Trace reports the empty result.
  std::string name = state_->name;
  if (int k = t->name_count_[name]++; k > 0) absl::StrAppend(&name, "#", k + 1);
  ProgramNode node{name, b, {}};
  if (inputs.size() != b.in_global.size()) {
    t->Fail(absl::InvalidArgumentError(absl::StrCat("node '", name, "': function '", state_->name,
                                                    "' takes ", b.in_global.size(),
                                                    " inputs, got ", inputs.size())));
  }
  for (size_t j = 0; j < inputs.size(); ++j) {
    const Value& v = inputs[j];
    if (v.trace_ != t->id_) {
      t->Fail(absl::InvalidArgumentError(absl::StrCat(
          "node '", name, "' input ", j,
          " comes from another trace (a value kept from a trace that has ended, or another "
          "program's)")));
      continue;
    }
    if (j < b.in_global.size() && !(v.spec_ == b.in_global[j])) {
      t->Fail(absl::InvalidArgumentError(absl::StrCat("node '", name, "' input ", j, " expects ",
                                                      b.in_global[j].ToString(), ", got ",
                                                      v.spec_.ToString())));
    }
    if (v.ref_.node == ValueRef::kArgNode && j < b.in_sharding.size() &&
        !t->arg_slices_[v.ref_.index].valid()) {
      t->arg_slices_[v.ref_.index] = b.slice;
      t->arg_shardings_[v.ref_.index] = b.in_sharding[j];
    }
    node.inputs.push_back(v.ref_);
  }
  const int index = static_cast<int>(t->ir_.nodes.size());
  t->ir_.nodes.push_back(std::move(node));
  for (size_t k = 0; k < b.out_global.size(); ++k)
    outs.push_back(Value(t->id_, {index, static_cast<int>(k)}, b.out_global[k]));
  return outs;
}

Value BoundFunction::operator()(const Value& input) const {
  std::vector<Value> outs = (*this)(std::vector<Value>{input});
  if (outs.size() != 1) {
    if (Tracer* t = Tracer::Current(); t != nullptr) {
      t->Fail(absl::InvalidArgumentError(absl::StrCat(
          "function '", state_->name, "' has ", outs.size(), " outputs; call it with a vector")));
    }
    return input;
  }
  return outs[0];
}

absl::StatusOr<Program> Client::Trace(const std::string& name, const std::vector<ArraySpec>& args,
                                      const std::function<std::vector<Value>(std::vector<Value>)>& fn) {
  Tracer t;
  t.ir_.name = name;
  t.ir_.args = args;
  t.arg_slices_.resize(args.size());
  t.arg_shardings_.resize(args.size());
  std::vector<Value> in;
  for (size_t i = 0; i < args.size(); ++i) in.push_back(t.Arg(static_cast<int>(i)));
  std::vector<Value> out = fn(in);
  for (const Value& v : out) {
    if (v.trace_ != t.id_) {
      t.Fail(absl::InvalidArgumentError(
          absl::StrCat("program '", name, "' returns a value from another trace")));
      break;
    }
    t.ir_.outputs.push_back(v.ref_);
  }
  if (!t.error_.ok()) return Annotate(t.error_, absl::StrCat("tracing program '", name, "'"));
  PW_ASSIGN_OR_RETURN(ProgramId id, controller_->RegisterProgram(id_, t.ir_));
  Program p;
  p.client_ = this;
  p.id_ = id;
  p.ir_ = std::make_shared<const ProgramIr>(std::move(t.ir_));
  p.arg_slices_ = std::move(t.arg_slices_);
  p.arg_shardings_ = std::move(t.arg_shardings_);
  return p;
}

// ---- Running

namespace {
// The end of a run: its refusal, or RunInfo::done.
Future<> EndOf(const Future<RunInfo>& run) {
  if (run.IsReady()) {
    const absl::StatusOr<RunInfo>& r = run.Await();
    return r.ok() ? r->done : Future<>::Ready(r.status());
  }
  Promise<> p;
  Future<> f = p.future();
  run.OnReady([p = std::move(p)](const absl::StatusOr<RunInfo>& r) mutable {
    if (!r.ok()) return p.Set(r.status());
    r->done.OnReady([p = std::move(p)](const absl::Status& s) mutable { p.Set(s); });
  });
  return f;
}
}  // namespace

absl::StatusOr<std::pair<std::vector<Array>, Future<>>> Program::RunAsync(
    const std::vector<Array>& args, const RunOptions& options) const {
  const ProgramIr& ir = *ir_;
  std::vector<BufferId> ids;
  ids.reserve(args.size());
  for (const Array& a : args) {
    if (!a.valid()) return absl::InvalidArgumentError("program argument is an empty Array");
    ids.push_back(a.id());
  }
  trace::Span span(trace::ClientTrack(client_->id()), "call", ir.name, client_->id().value());
  RunOptions traced = options;
  if (span.active() && (traced.trace_flow = client_->NextCallFlow()) != 0) {
    span.Arg("program", ir.name).FlowOut(traced.trace_flow);
  }
  // The outputs get ids of this client's choosing (one per distinct value), and their layout
  // from the program; where they lie comes with the controller's acceptance.
  const size_t n = ir.outputs.size();
  std::vector<int> same_as(n);
  int distinct = 0;
  for (size_t o = 0; o < n; ++o) {
    same_as[o] = static_cast<int>(o);
    for (size_t e = 0; e < o; ++e)
      if (ir.outputs[e] == ir.outputs[o]) same_as[o] = same_as[e];
    distinct += same_as[o] == static_cast<int>(o);
  }
  // Ids taken and the run submitted under one lock (TakeOutputIds). Issue 23: two threads'
  // calls could reach the controller in the other order, and the later id's run was refused.
  pw::MutexLock submit_lock(&client_->submit_mu_);
  PW_ASSIGN_OR_RETURN(std::vector<BufferId> fresh, client_->TakeOutputIds(distinct));
  std::vector<ArrayInfo> outs(n);
  traced.outputs.resize(n);
  for (size_t o = 0, next = 0; o < n; ++o) {
    const ValueRef& r = ir.outputs[o];
    if (r.node < 0 || r.node >= static_cast<int>(ir.nodes.size()))  // Refused at registration.
      return absl::InvalidArgumentError(absl::StrCat("program '", ir.name, "' output ", o,
                                                     " is not a computed value"));
    const Binding& b = ir.nodes[r.node].binding;
    traced.outputs[o] = same_as[o] == static_cast<int>(o) ? fresh[next++] : traced.outputs[same_as[o]];
    outs[o] = {traced.outputs[o], b.out_global[r.index], b.out_sharding[r.index], b.slice, {}, {}};
  }
  Future<RunInfo> run = client_->controller()->Submit(client_->id(), id_, ids, traced);
  if (run.IsReady()) {  // In one process the answer is in already: a refusal is returned here.
    PW_RETURN_IF_ERROR(run.status());
    if (span.active()) span.Arg("run", run.Await()->run.value());
  }
  Future<> done = EndOf(run);
  std::vector<Array> arrays;
  arrays.reserve(n);
  for (size_t o = 0; o < n; ++o) {
    arrays.push_back(Array(std::shared_ptr<Array::Handle>(new Array::Handle{
        client_->controller(), client_->id(), std::move(outs[o]), run, static_cast<int>(o), done})));
  }
  return std::make_pair(std::move(arrays), std::move(done));
}

absl::StatusOr<std::string> Program::Explain() const {
  return client_->controller()->ExplainProgram(client_->id(), id_);
}

absl::StatusOr<std::vector<Array>> Program::Run(const std::vector<Array>& args,
                                                const RunOptions& options) const {
  PW_ASSIGN_OR_RETURN(auto r, RunAsync(args, options));
  return std::move(r.first);
}

absl::StatusOr<std::vector<Array>> Program::Call(const std::vector<HostArray>& args,
                                                 const RunOptions& options) const {
  if (args.size() != ir_->args.size()) {
    return absl::InvalidArgumentError(absl::StrCat("program '", ir_->name, "' takes ",
                                                   ir_->args.size(), " arguments, got ",
                                                   args.size()));
  }
  std::vector<Array> arrays;
  for (size_t i = 0; i < args.size(); ++i) {
    PW_ASSIGN_OR_RETURN(Array a, PutArg(i, args[i]));
    arrays.push_back(std::move(a));
  }
  return Run(arrays, options);
}

absl::StatusOr<Array> Program::PutArg(size_t i, HostArray value) const {
  if (i >= ir_->args.size())
    return absl::InvalidArgumentError(absl::StrCat("program '", ir_->name, "' takes ",
                                                   ir_->args.size(), " arguments, not ", i + 1));
  if (!(value.spec == ir_->args[i])) {
    return absl::InvalidArgumentError(absl::StrCat("program '", ir_->name, "' argument ", i,
                                                   " expects ", ir_->args[i].ToString(), ", got ",
                                                   value.spec.ToString()));
  }
  return client_->Put(std::move(value), arg_slices_[i], arg_shardings_[i]);
}

absl::StatusOr<std::vector<Array>> BoundFunction::Call(const std::vector<Array>& inputs,
                                                       const RunOptions& options) const {
  std::shared_ptr<const Program> op;
  {
    pw::MutexLock lock(&state_->mu);
    if (state_->op == nullptr) {
      Client* c = state_->client;
      const Binding& b = state_->binding;
      ProgramIr ir{state_->name, b.in_global, {{state_->name, b, {}}}, {}};
      for (size_t j = 0; j < b.in_global.size(); ++j)
        ir.nodes[0].inputs.push_back({ValueRef::kArgNode, static_cast<int>(j)});
      for (size_t k = 0; k < b.out_global.size(); ++k)
        ir.outputs.push_back({0, static_cast<int>(k)});
      auto p = std::make_shared<Program>();
      PW_ASSIGN_OR_RETURN(p->id_, c->controller()->RegisterProgram(c->id(), ir));
      p->client_ = c;
      p->arg_slices_.assign(b.in_global.size(), b.slice);
      p->arg_shardings_ = b.in_sharding;
      p->ir_ = std::make_shared<const ProgramIr>(std::move(ir));
      state_->op = std::move(p);
    }
    op = state_->op;
  }
  return op->Run(inputs, options);
}

// ---- Timelines (pw/trace)

uint64_t Client::NextCallFlow() {
  return trace::FlowId(id_.value(), trace::Stage::kCall, calls_.fetch_add(1));
}

absl::Status Client::StartTrace() {
  pw::MutexLock lock(&trace_mu_);
  if (trace_since_ >= 0)
    return absl::FailedPreconditionError("this client is tracing already");
  const int64_t since = trace::Recorder::Get().Start();
  const int64_t t0 = trace::Now();
  absl::StatusOr<int64_t> remote = controller_->StartTrace(id_);
  if (!remote.ok()) {
    trace::Recorder::Get().Stop();
    return remote.status();
  }
  controller_clock_.Sample(t0, *remote, trace::Now());
  trace_since_ = since;
  return absl::OkStatus();
}

absl::StatusOr<trace::Chunk> Client::StopTrace(bool all_tenants) {
  pw::MutexLock lock(&trace_mu_);
  if (trace_since_ < 0) return absl::FailedPreconditionError("this client is not tracing");
  trace::Recorder& recorder = trace::Recorder::Get();
  const int64_t t0 = trace::Now();
  absl::StatusOr<trace::Chunk> chunk = controller_->StopTrace(id_, all_tenants).Await();
  if (chunk.ok()) controller_clock_.Sample(t0, chunk->clock, trace::Now());
  std::vector<trace::Event> mine = recorder.Collect(trace_since_);
  recorder.Stop();
  trace_since_ = -1;
  PW_RETURN_IF_ERROR(chunk.status());
  // This process's spans, unless the controller's already hold them (an embedded cluster).
  if (std::find(chunk->processes.begin(), chunk->processes.end(), recorder.process_id()) ==
      chunk->processes.end()) {
    trace::Shift(mine, controller_clock_.offset());
    size_t added = 0;
    for (trace::Event& e : mine) {
      if (e.client != id_.value() && e.client >= 0) continue;  // Another client's, here.
      chunk->events.push_back(std::move(e));
      ++added;
    }
    if (added > 0) chunk->processes.push_back(recorder.process_id());
  }
  return chunk;
}

}  // namespace pw
