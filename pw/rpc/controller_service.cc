#include "pw/rpc/controller_service.h"


#include <utility>

#include "absl/strings/str_cat.h"
#include "pw/base/heap.h"
#include "pw/base/status_macros.h"
#include "pw/rpc/reactors.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {
namespace v1 = ::pathways::v1;


// A handler's first line: authorizes the call (and its client), or replies with the error.
#define PW_AUTHORIZE(...)                                                    \
  if (absl::Status auth_ = Authorize(__VA_ARGS__); !auth_.ok()) return Reply(ctx, auth_)

ControllerService::ControllerService(ControllerInterface* controller,
                                     ClusterMembership* membership, std::string client_token,
                                     std::string cluster_token, ClientLimits limits)
    : controller_(controller),
      membership_(membership),
      token_(std::move(client_token)),
      cluster_token_(std::move(cluster_token)),
      limits_(limits) {
  for (int i = 0; i < 4; ++i)
    blocking_.push_back(std::make_unique<WorkQueue>(absl::StrCat("pw-ctrl-rpc", i)));
  for (int i = 0; i < 2; ++i)
    session_mail_.push_back(std::make_unique<WorkQueue>(absl::StrCat("pw-ctrl-mail", i)));
}

grpc::ServerUnaryReactor* ControllerService::Offload(grpc::CallbackServerContext* ctx,
                                                     absl::AnyInvocable<absl::Status() &&> fn,
                                                     bool membership) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  // Queue 0 is membership's alone: a worker (re)joining never waits behind client calls stuck
  // on a hung worker.
  const size_t i =
      membership ? 0
                 : 1 + next_blocking_.fetch_add(1, std::memory_order_relaxed) % (blocking_.size() - 1);
  blocking_[i]->Post([r, fn = std::move(fn)]() mutable { r->Finish(ToGrpc(std::move(fn)())); });
  return r;
}

size_t ControllerService::num_clients() const {
  pw::MutexLock lock(&mu_);
  return keys_.size();
}

// The cluster token (the admin's, e.g. `pw trace`) serves as the client token too.
absl::Status ControllerService::Authorize(const grpc::CallbackServerContext* ctx) const {
  if (!cluster_token_.empty() && AuthorizeMember(ctx).ok()) return absl::OkStatus();
  return CheckToken(ctx, token_);
}

absl::Status ControllerService::OpenSession(const grpc::CallbackServerContext* ctx,
                                            int64_t client) {
  PW_RETURN_IF_ERROR(Authorize(ctx, client));
  pw::MutexLock lock(&mu_);
  auto it = keys_.find(ClientId(client));
  if (it == keys_.end())  // Dropped since.
    return absl::UnauthenticatedError(absl::StrCat(ClientId(client).ToString(), " is not connected"));
  if (it->second.session)
    return absl::AlreadyExistsError(
        absl::StrCat(ClientId(client).ToString(), " already has a Session open"));
  it->second.session = true;
  return absl::OkStatus();
}

absl::Status ControllerService::AuthorizeMember(const grpc::CallbackServerContext* ctx) const {
  return CheckClusterToken(ctx, cluster_token_);
}

absl::Status ControllerService::Authorize(const grpc::CallbackServerContext* ctx,
                                          int64_t client) const {
  PW_RETURN_IF_ERROR(Authorize(ctx));
  const std::string key = Metadata(ctx, "pw-client-key");
  pw::MutexLock lock(&mu_);
  // One answer whether the client is unknown or the key wrong (which ids are connected is not
  // revealed), and the key compared in constant time.
  auto it = keys_.find(ClientId(client));
  if (it == keys_.end() || !SecretEquals(key, it->second.key))
    return absl::UnauthenticatedError(
        absl::StrCat(ClientId(client).ToString(),
                     " is not connected, or this call does not carry its client key"));
  return absl::OkStatus();
}

int ControllerService::ReapSessionless(absl::Time now) {
  std::vector<ClientId> stale;
  {
    pw::MutexLock lock(&mu_);
    for (const auto& [id, c] : keys_)
      if (!c.session && now - c.since > limits_.session_grace) stale.push_back(id);
  }
  for (ClientId id : stale) (void)DropClient(id);
  return static_cast<int>(stale.size());
}

absl::Status ControllerService::DropClient(ClientId client) {
  {
    pw::MutexLock lock(&mu_);
    if (keys_.erase(client) == 0) return absl::OkStatus();
  }
  return controller_->Disconnect(client);
}

grpc::ServerUnaryReactor* ControllerService::Connect(grpc::CallbackServerContext* ctx,
                                                     const v1::ConnectRequest* req,
                                                     v1::ConnectResponse* resp) {
  PW_AUTHORIZE(ctx);
  if (req->protocol_version() != kProtocolVersion) {
    return Reply(ctx, absl::FailedPreconditionError(absl::StrCat(
                          "client '", req->name(), "' speaks pathways protocol version ",
                          req->protocol_version(), " but this controller speaks version ",
                          kProtocolVersion, "; use matching builds")));
  }
  {
    pw::MutexLock lock(&mu_);
    if (static_cast<int64_t>(keys_.size()) + connecting_ >= limits_.max_clients)
      return Reply(ctx, absl::ResourceExhaustedError(absl::StrCat(
                            "client '", req->name(), "': the controller already serves ",
                            limits_.max_clients,
                            " clients, its limit (pw controller --max-clients raises it)")));
    ++connecting_;
  }
  absl::StatusOr<ClientId> id =
      controller_->Connect(req->name(), ConnectOptions{req->tenant(), req->share()});
  std::string key = NewSecret();
  {
    pw::MutexLock lock(&mu_);
    --connecting_;
    if (id.ok()) keys_[*id] = Connected{key, absl::Now()};
  }
  if (!id.ok()) return Reply(ctx, id.status());
  resp->set_client(id->value());
  resp->set_client_key(std::move(key));
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ControllerService::Disconnect(grpc::CallbackServerContext* ctx,
                                                        const v1::ClientRequest* req, v1::Empty*) {
  PW_AUTHORIZE(ctx, req->client());
  return Reply(ctx, DropClient(ClientId(req->client())));
}

grpc::ServerUnaryReactor* ControllerService::AllocateSlice(grpc::CallbackServerContext* ctx,
                                                           const v1::AllocateSliceRequest* req,
                                                           v1::SliceInfo* resp) {
  PW_AUTHORIZE(ctx, req->client());
  absl::StatusOr<SliceRequest> r = FromProto(req->request());
  if (!r.ok()) return Reply(ctx, Annotate(r.status(), "AllocateSlice"));
  absl::StatusOr<SliceInfo> info = controller_->AllocateSlice(ClientId(req->client()), *r);
  if (info.ok()) ToProto(*info, resp);
  return Reply(ctx, info.status());
}

grpc::ServerUnaryReactor* ControllerService::ReleaseSlice(grpc::CallbackServerContext* ctx,
                                                          const v1::ReleaseSliceRequest* req,
                                                          v1::Empty*) {
  PW_AUTHORIZE(ctx, req->client());
  return Reply(ctx, controller_->ReleaseSlice(ClientId(req->client()), SliceId(req->slice())));
}

grpc::ServerUnaryReactor* ControllerService::RegisterFunction(
    grpc::CallbackServerContext* ctx, const v1::RegisterFunctionRequest* req,
    v1::FunctionInfo* resp) {
  PW_AUTHORIZE(ctx, req->client());
  absl::StatusOr<FunctionDef> def = FromProto(req->def());
  if (!def.ok()) return Reply(ctx, Annotate(def.status(), "RegisterFunction"));
  return Offload(ctx, [this, req, resp, def = *std::move(def)]() {
    absl::StatusOr<FunctionInfo> info = controller_->RegisterFunction(ClientId(req->client()), def);
    if (info.ok()) ToProto(*info, resp);
    return info.status();
  });
}

grpc::ServerUnaryReactor* ControllerService::LoadFunction(grpc::CallbackServerContext* ctx,
                                                          const v1::LoadFunctionRequest* req,
                                                          v1::ArraySpecs* resp) {
  PW_AUTHORIZE(ctx, req->client());
  // Off gRPC's threads: it loads the function on the slice's workers (RPCs that wait).
  return Offload(ctx, [this, req, resp]() {
    auto specs = controller_->LoadFunction(ClientId(req->client()), FunctionId(req->function()),
                                           SliceId(req->slice()));
    if (specs.ok())
      for (const ArraySpec& s : *specs) ToProto(s, resp->add_specs());
    return specs.status();
  });
}

grpc::ServerUnaryReactor* ControllerService::RegisterProgram(
    grpc::CallbackServerContext* ctx, const v1::RegisterProgramRequest* req, v1::ProgramId* resp) {
  PW_AUTHORIZE(ctx, req->client());
  absl::StatusOr<ProgramIr> ir = FromProto(req->ir());
  if (!ir.ok()) return Reply(ctx, Annotate(ir.status(), "RegisterProgram"));
  absl::StatusOr<ProgramId> id = controller_->RegisterProgram(ClientId(req->client()), *ir);
  if (id.ok()) resp->set_id(id->value());
  return Reply(ctx, id.status());
}

grpc::ServerUnaryReactor* ControllerService::ExplainProgram(grpc::CallbackServerContext* ctx,
                                                            const v1::ProgramRequest* req,
                                                            v1::Text* resp) {
  PW_AUTHORIZE(ctx, req->client());
  auto text = controller_->ExplainProgram(ClientId(req->client()), ProgramId(req->program()));
  if (text.ok()) resp->set_text(*text);
  return Reply(ctx, text.status());
}

grpc::ServerUnaryReactor* ControllerService::ReserveBufferIds(
    grpc::CallbackServerContext* ctx, const v1::ReserveBufferIdsRequest* req,
    v1::BufferIdRange* resp) {
  PW_AUTHORIZE(ctx, req->client());
  auto first = controller_->ReserveBufferIds(ClientId(req->client()), req->count());
  if (first.ok()) resp->set_first(first->value());
  return Reply(ctx, first.status());
}

grpc::ServerUnaryReactor* ControllerService::PutArray(grpc::CallbackServerContext* ctx,
                                                      const v1::PutArrayRequest* req,
                                                      v1::ArrayInfo* resp) {
  PW_AUTHORIZE(ctx, req->client());
  absl::StatusOr<Sharding> sharding = FromProto(req->sharding());
  if (!sharding.ok()) return Reply(ctx, Annotate(sharding.status(), "PutArray sharding"));
  // The request is this call's until it finishes: its bytes move into the array (and the
  // message's copy is freed) instead of being copied once more.
  auto* value = const_cast<v1::HostArray*>(&req->value());
  const size_t bytes = value->data().size();
  absl::StatusOr<HostArray> array = FromProto(value);
  if (!array.ok()) return Reply(ctx, Annotate(array.status(), "PutArray value"));
  auto info = controller_->PutArray(ClientId(req->client()), SliceId(req->slice()), *sharding,
                                    *std::move(array));
  if (info.ok()) ToProto(*info, resp);
  // The request's slices and copies are freed when the call ends; the monitor then gives a large
  // message's memory back to the system (pw/base/heap.h).
  CountTransientBytes(static_cast<int64_t>(bytes));
  return Reply(ctx, info.status());
}

namespace {
void ToProto(const ShardTransfer& t, v1::ShardTransfer* out) {
  out->set_rank(t.rank);
  out->set_address(t.address);
  out->set_key(t.key);
}
}  // namespace

grpc::ServerUnaryReactor* ControllerService::BeginPut(grpc::CallbackServerContext* ctx,
                                                      const v1::BeginPutRequest* req,
                                                      v1::DirectPut* resp) {
  PW_AUTHORIZE(ctx, req->client());
  absl::StatusOr<Sharding> sharding = FromProto(req->sharding());
  if (!sharding.ok()) return Reply(ctx, Annotate(sharding.status(), "BeginPut sharding"));
  absl::StatusOr<ArraySpec> spec = FromProto(req->spec());
  if (!spec.ok()) return Reply(ctx, Annotate(spec.status(), "BeginPut spec"));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  controller_->BeginPut(ClientId(req->client()), SliceId(req->slice()), *sharding, *spec)
      .OnReady([reactor, resp](const absl::StatusOr<DirectPut>& put) {
        if (put.ok()) {
          ToProto(put->info, resp->mutable_info());
          for (const ShardTransfer& t : put->shards) ToProto(t, resp->add_shards());
        }
        reactor->Finish(ToGrpc(put.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::LocateArray(grpc::CallbackServerContext* ctx,
                                                         const v1::LocateArrayRequest* req,
                                                         v1::LocatedArray* resp) {
  PW_AUTHORIZE(ctx, req->client());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  controller_->LocateArray(ClientId(req->client()), BufferId(req->buffer()), req->inline_only())
      .OnReady([reactor, resp](const absl::StatusOr<LocatedArray>& a) {
        if (a.ok()) {
          if (a->value.has_value()) {
            ToProto(*a->value, resp->mutable_value());
            CountTransientBytes(static_cast<int64_t>(a->value->bytes.size()));
          }
          ToProto(a->spec, resp->mutable_spec());
          ToProto(a->sharding, resp->mutable_sharding());
          for (const ShardTransfer& t : a->shards) ToProto(t, resp->add_shards());
        }
        reactor->Finish(ToGrpc(a.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::ArrayReady(grpc::CallbackServerContext* ctx,
                                                        const v1::ArrayRequest* req, v1::Empty*) {
  PW_AUTHORIZE(ctx, req->client());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  controller_->ArrayReady(ClientId(req->client()), BufferId(req->buffer()))
      .OnReady([reactor](const absl::Status& s) { reactor->Finish(ToGrpc(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::SaveArray(grpc::CallbackServerContext* ctx,
                                                       const v1::SaveArrayRequest* req,
                                                       v1::Empty*) {
  PW_AUTHORIZE(ctx, req->client());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  controller_->SaveArray(ClientId(req->client()), BufferId(req->buffer()), req->path())
      .OnReady([reactor](const absl::Status& s) { reactor->Finish(ToGrpc(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::LoadArray(grpc::CallbackServerContext* ctx,
                                                       const v1::LoadArrayRequest* req,
                                                       v1::ArrayInfo* resp) {
  PW_AUTHORIZE(ctx, req->client());
  absl::StatusOr<Sharding> sharding = FromProto(req->sharding());
  if (!sharding.ok()) return Reply(ctx, Annotate(sharding.status(), "LoadArray sharding"));
  absl::StatusOr<ArraySpec> spec = FromProto(req->spec());
  if (!spec.ok()) return Reply(ctx, Annotate(spec.status(), "LoadArray spec"));
  absl::StatusOr<ArrayInfo> info = controller_->LoadArray(
      ClientId(req->client()), SliceId(req->slice()), *sharding, *spec, req->path());
  if (info.ok()) ToProto(*info, resp);
  return Reply(ctx, info.status());
}

grpc::ServerUnaryReactor* ControllerService::CommitCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::CommitCheckpointRequest* req,
    v1::CheckpointPath* resp) {
  PW_AUTHORIZE(ctx, req->client());
  std::vector<std::pair<std::string, std::string>> files;
  for (const v1::CheckpointFile& f : req->files()) files.emplace_back(f.name(), f.contents());
  absl::StatusOr<std::string> path = controller_->CommitCheckpoint(
      ClientId(req->client()), req->path(), files, req->final_path());
  if (path.ok()) resp->set_path(*path);
  return Reply(ctx, path.status());
}

grpc::ServerUnaryReactor* ControllerService::ShareArray(grpc::CallbackServerContext* ctx,
                                                        const v1::ShareArrayRequest* req,
                                                        v1::ShareToken* resp) {
  PW_AUTHORIZE(ctx, req->client());
  absl::StatusOr<std::string> token = controller_->ShareArray(
      ClientId(req->client()), BufferId(req->buffer()), {req->writable(), req->token()});
  if (token.ok()) resp->set_token(*token);
  return Reply(ctx, token.status());
}

grpc::ServerUnaryReactor* ControllerService::ImportArray(grpc::CallbackServerContext* ctx,
                                                         const v1::ShareRequest* req,
                                                         v1::ArrayInfo* resp) {
  PW_AUTHORIZE(ctx, req->client());
  absl::StatusOr<ArrayInfo> info = controller_->ImportArray(ClientId(req->client()), req->token());
  if (info.ok()) ToProto(*info, resp);
  return Reply(ctx, info.status());
}

grpc::ServerUnaryReactor* ControllerService::RevokeShare(grpc::CallbackServerContext* ctx,
                                                         const v1::ShareRequest* req, v1::Empty*) {
  PW_AUTHORIZE(ctx, req->client());
  return Reply(ctx, controller_->RevokeShare(ClientId(req->client()), req->token()));
}

grpc::ServerUnaryReactor* ControllerService::Status(grpc::CallbackServerContext* ctx,
                                                    const v1::StatusRequest* req,
                                                    v1::ClusterStatus* resp) {
  // The cluster's processes and its admin (the cluster token: `pw status` where `pw up` ran) see
  // which programs run; a client sees runs and their clients, not other clients' program names.
  const bool admin = AuthorizeMember(ctx).ok();
  if (!admin) PW_AUTHORIZE(ctx);
  const bool reset_peak = req->reset_peak_memory();
  // The controller's peak memory is the cluster's to reset (pw bench io as its admin): a client
  // could otherwise hide another's peak.
  if (reset_peak && !admin)
    return Reply(ctx, absl::PermissionDeniedError("Status: resetting the controller's peak "
                                                  "memory needs the cluster token"));
  return Offload(ctx, [this, resp, admin, reset_peak]() -> absl::Status {
    if (reset_peak) ResetPeakResidentMemory();
    PW_ASSIGN_OR_RETURN(ClusterStatus status, controller_->Status());
    const ResidentMemory mem = ReadResidentMemory();
    if (!admin)
      for (ClusterStatus::Running& r : status.running) r.program.clear();
    ToProto(status, resp);
    resp->set_controller_rss_bytes(mem.now);
    resp->set_controller_peak_rss_bytes(mem.peak);
    membership_->AddMembers(resp);
    resp->set_clients(static_cast<int64_t>(num_clients()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ControllerService::RegisterWorker(
    grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* req,
    v1::RegisterWorkerResponse* resp) {
  if (absl::Status a = AuthorizeMember(ctx); !a.ok()) return Reply(ctx, a);
  if (req->protocol_version() != kProtocolVersion) {
    return Reply(ctx, absl::FailedPreconditionError(absl::StrCat(
                          "worker for host:", req->host(), " speaks pathways protocol version ",
                          req->protocol_version(), " but this controller speaks version ",
                          kProtocolVersion)));
  }
  return Offload(
      ctx,
      [this, req, resp] {
        auto r = membership_->RegisterWorker(*req);
        if (r.ok()) *resp = *std::move(r);
        return r.status();
      },
      /*membership=*/true);
}

grpc::ServerUnaryReactor* ControllerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  if (absl::Status a = AuthorizeMember(ctx); !a.ok()) return Reply(ctx, a);
  absl::Status s = membership_->Heartbeat(HostId(req->host()));
  resp->set_clock_ns(trace::Now());  // The worker's trace clock offset (pw/trace).
  return Reply(ctx, s);
}

grpc::ServerUnaryReactor* ControllerService::GetClusterSpec(grpc::CallbackServerContext* ctx,
                                                          const v1::Empty*, v1::Text* resp) {
  if (absl::Status a = AuthorizeMember(ctx); !a.ok()) return Reply(ctx, a);
  resp->set_text(membership_->ClusterSpecJson());
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ControllerService::Shutdown(grpc::CallbackServerContext* ctx,
                                                      const v1::Empty*, v1::Empty*) {
  if (absl::Status a = AuthorizeMember(ctx); !a.ok()) return Reply(ctx, a);
  membership_->Shutdown();
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ControllerService::Cancel(grpc::CallbackServerContext* ctx,
                                                    const v1::CancelRequest* req,
                                                    v1::CancelResponse* resp) {
  if (absl::Status a = AuthorizeMember(ctx); !a.ok()) return Reply(ctx, a);
  return Offload(ctx, [this, req, resp]() -> absl::Status {
    PW_ASSIGN_OR_RETURN(std::vector<RunId> runs, membership_->Cancel(*req));
    for (RunId r : runs) resp->add_runs(r.value());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ControllerService::SetTenant(grpc::CallbackServerContext* ctx,
                                                       const v1::TenantSettings* req, v1::Empty*) {
  // Shares and quotas are the cluster's admin's (the cluster token: `pw tenant set`).
  if (!AuthorizeMember(ctx).ok())
    return Reply(ctx, absl::PermissionDeniedError(
                          "setting a tenant's share or memory quota needs the cluster token "
                          "(pw tenant where pw up ran, or PW_CLUSTER_TOKEN)"));
  TenantSettings t;
  t.name = req->name();
  if (req->has_share()) t.share = req->share();
  if (req->has_memory_bytes()) t.memory_bytes = req->memory_bytes();
  return Reply(ctx, controller_->SetTenant(t));
}

grpc::ServerUnaryReactor* ControllerService::StartTrace(grpc::CallbackServerContext* ctx,
                                                        const v1::ClientRequest* req,
                                                        v1::Clock* resp) {
  PW_AUTHORIZE(ctx, req->client());
  return Offload(ctx, [this, req, resp]() -> absl::Status {  // It tells every worker process.
    PW_ASSIGN_OR_RETURN(int64_t clock, controller_->StartTrace(ClientId(req->client())));
    resp->set_ns(clock);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ControllerService::StopTrace(grpc::CallbackServerContext* ctx,
                                                       const v1::StopTraceRequest* req,
                                                       v1::TraceChunk* resp) {
  PW_AUTHORIZE(ctx, req->client());
  // Every tenant's spans in full are the admin's (the cluster token), as in Status.
  if (req->all_tenants() && !AuthorizeMember(ctx).ok())
    return Reply(ctx, absl::PermissionDeniedError(
                          "a trace of every tenant's spans needs the cluster token (pw trace "
                          "where pw up ran, or PW_CLUSTER_TOKEN); without it, other clients' "
                          "spans are anonymous"));
  return Offload(ctx, [this, req, resp]() -> absl::Status {  // It asks every worker process.
    absl::StatusOr<trace::Chunk> chunk =
        controller_->StopTrace(ClientId(req->client()), req->all_tenants()).Await();
    if (chunk.ok()) ToProto(*chunk, resp);
    return chunk.status();
  });
}

}  // namespace pw::rpc
