#include "pw/rpc/remote_controller.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/rpc/mail.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {
namespace v1 = ::pathways::v1;

RemoteController::RemoteController(std::string address, const ChannelOptions& options)
    : core_(std::make_shared<Core>()) {
  core_->address = std::move(address);
  core_->options = options;
  core_->channel = MakeChannel(core_->address, options, &core_->in_process_generation);
  core_->stub = v1::Controller::NewStub(core_->channel);
}

absl::StatusOr<std::unique_ptr<RemoteController>> RemoteController::Dial(
    const std::string& address, const ChannelOptions& options, absl::Duration timeout) {
  ChannelOptions o = options;
  if (o.tls == nullptr) {
    PW_ASSIGN_OR_RETURN(o.tls, dataplane::TlsFromEnvironment());
  }
  std::unique_ptr<RemoteController> c(new RemoteController(address, o));
  if (!WaitForConnected(*c->core_->channel, address, c->core_->in_process_generation,
                        absl::Now() + timeout)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach a pathways controller at ", address, " within ",
        absl::FormatDuration(timeout),
        o.tls == nullptr ? " (if it serves TLS, set PW_TLS_CA to its CA certificate)"
                         : " over TLS (is PW_TLS_CA the CA of its certificate, and does the "
                           "certificate name this address?)"));
  }
  return c;
}

RemoteController::~RemoteController() {
  absl::flat_hash_map<ClientId, std::shared_ptr<ClientSession>> sessions;
  {
    pw::MutexLock lock(&core_->mu);
    sessions.swap(core_->sessions);
  }
  for (auto& [id, s] : sessions) s->Close();
}

std::shared_ptr<ClientSession> RemoteController::Core::SessionOf(ClientId client) const {
  pw::MutexLock lock(&mu);
  auto it = sessions.find(client);
  return it == sessions.end() ? nullptr : it->second;
}

std::optional<ClientSession::Mail> RemoteController::Core::SessionMail() {
  std::string name;
  uint64_t key = 0;
  {
    pw::MutexLock lock(&mu);
    if (!mailbox_tried) {
      mailbox_tried = true;
      auto made = dataplane::ShmMailbox::Create(
          [this](absl::string_view message) { ReceiveMail(message); }, kClientMailboxBytes);
      if (made.ok()) mailbox = *std::move(made);  // Else the sessions stay on their streams.
    }
    if (mailbox == nullptr) return std::nullopt;
    name = mailbox->name();
    key = mailbox->key();
  }
  ClientSession::Mail mail;
  mail.self_mailbox = std::move(name);
  mail.self_key = key;
  mail.open = [](const std::string& controller)
      -> absl::StatusOr<std::function<bool(const v1::PeerMail&)>> {
    PW_ASSIGN_OR_RETURN(std::shared_ptr<dataplane::ShmMailbox> to,
                        dataplane::ShmMailbox::Open(controller));
    return [to](const v1::PeerMail& m) { return SendMail(*to, m).ok(); };
  };
  mail.drain = [this] {
    dataplane::ShmMailbox* own = nullptr;
    {
      pw::MutexLock lock(&mu);
      own = mailbox.get();
    }
    if (own != nullptr) own->Flush();
  };
  return mail;
}

void RemoteController::Core::ReceiveMail(absl::string_view message) {
  v1::PeerMail mail;
  if (!mail.ParseFromArray(message.data(), static_cast<int>(message.size())) ||
      !mail.has_session_events())
    return;
  std::shared_ptr<ClientSession> to;
  {
    pw::MutexLock lock(&mu);
    auto it = by_stub.find(mail.session_events().stub());
    if (it != by_stub.end()) to = it->second.lock();
  }
  if (to != nullptr) to->OnMailedEvents(mail.session_events().batch());
}

absl::Status RemoteController::Core::Where(const grpc::Status& s) const {
  absl::Status st = FromGrpc(s);
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE)
    return Annotate(st, absl::StrCat("controller at ", address));
  return st;
}

void RemoteController::Core::Prepare(grpc::ClientContext* ctx, ClientId client) const {
  AddToken(ctx, options.token);
  pw::MutexLock lock(&mu);
  auto it = keys.find(client);
  if (it != keys.end()) ctx->AddMetadata("pw-client-key", it->second);
}

absl::StatusOr<ClientId> RemoteController::Connect(const std::string& name,
                                                   const ConnectOptions& options) {
  v1::ConnectRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_name(name);
  req.set_tenant(options.tenant);
  req.set_share(options.share);
  v1::ConnectResponse resp;
  grpc::ClientContext ctx;
  AddToken(&ctx, core_->options.token);
  if (grpc::Status s = core_->stub->Connect(&ctx, req, &resp); !s.ok()) return core_->Where(s);
  const ClientId id(resp.client());
  auto session = std::make_shared<ClientSession>(
      core_->stub.get(), id,
      [token = core_->options.token, key = resp.client_key()](grpc::ClientContext* ctx) {
        AddToken(ctx, token);
        ctx->AddMetadata("pw-client-key", key);
      },
      core_->address, core_->SessionMail());
  pw::MutexLock lock(&core_->mu);
  core_->keys[id] = resp.client_key();
  if (session->mail_stub() != 0) core_->by_stub[session->mail_stub()] = session;
  core_->sessions[id] = std::move(session);
  return id;
}

absl::Status RemoteController::Disconnect(ClientId client) {
  v1::ClientRequest req;
  req.set_client(client.value());
  v1::Empty resp;
  grpc::ClientContext ctx;
  core_->Prepare(&ctx, client);
  grpc::Status s = core_->stub->Disconnect(&ctx, req, &resp);
  std::shared_ptr<ClientSession> session;
  {
    pw::MutexLock lock(&core_->mu);
    if (auto it = core_->sessions.find(client); it != core_->sessions.end()) {
      session = std::move(it->second);
      core_->sessions.erase(it);
    }
    core_->keys.erase(client);
  }
  if (session != nullptr) {
    session->Close();
    pw::MutexLock lock(&core_->mu);
    core_->by_stub.erase(session->mail_stub());
  }
  return s.ok() ? absl::OkStatus() : core_->Where(s);
}

// One synchronous call: `fill` sets the request, `take` reads the response.
#define PW_CALL(Method, client, req, resp)                 \
  grpc::ClientContext ctx;                                 \
  core_->Prepare(&ctx, client);                                   \
  if (grpc::Status s = core_->stub->Method(&ctx, req, &resp); !s.ok()) return core_->Where(s)

absl::StatusOr<SliceInfo> RemoteController::AllocateSlice(ClientId client,
                                                          const SliceRequest& request) {
  v1::AllocateSliceRequest req;
  req.set_client(client.value());
  ToProto(request, req.mutable_request());
  v1::SliceInfo resp;
  PW_CALL(AllocateSlice, client, req, resp);
  return FromProto(resp);
}

absl::Status RemoteController::ReleaseSlice(ClientId client, SliceId slice) {
  v1::ReleaseSliceRequest req;
  req.set_client(client.value());
  req.set_slice(slice.value());
  v1::Empty resp;
  PW_CALL(ReleaseSlice, client, req, resp);
  return absl::OkStatus();
}

absl::StatusOr<FunctionInfo> RemoteController::RegisterFunction(ClientId client,
                                                                const FunctionDef& def) {
  v1::RegisterFunctionRequest req;
  req.set_client(client.value());
  ToProto(def, req.mutable_def());
  v1::FunctionInfo resp;
  PW_CALL(RegisterFunction, client, req, resp);
  return FromProto(resp);
}

absl::StatusOr<std::vector<ArraySpec>> RemoteController::LoadFunction(ClientId client,
                                                                      FunctionId function,
                                                                      SliceId slice) {
  v1::LoadFunctionRequest req;
  req.set_client(client.value());
  req.set_function(function.value());
  req.set_slice(slice.value());
  v1::ArraySpecs resp;
  PW_CALL(LoadFunction, client, req, resp);
  std::vector<ArraySpec> specs;
  for (const auto& s : resp.specs()) {
    PW_ASSIGN_OR_RETURN(ArraySpec spec, FromProto(s));
    specs.push_back(std::move(spec));
  }
  return specs;
}

absl::StatusOr<ProgramId> RemoteController::RegisterProgram(ClientId client, const ProgramIr& ir) {
  v1::RegisterProgramRequest req;
  req.set_client(client.value());
  ToProto(ir, req.mutable_ir());
  v1::ProgramId resp;
  PW_CALL(RegisterProgram, client, req, resp);
  return ProgramId(resp.id());
}

absl::StatusOr<std::string> RemoteController::ExplainProgram(ClientId client, ProgramId program) {
  v1::ProgramRequest req;
  req.set_client(client.value());
  req.set_program(program.value());
  v1::Text resp;
  PW_CALL(ExplainProgram, client, req, resp);
  return resp.text();
}

bool RemoteController::SendsDirectly(const ArraySpec& spec, size_t bytes) {
  return direct_io() && static_cast<int64_t>(bytes) >= kDirectIoMinBytes &&
         static_cast<int64_t>(bytes) == spec.size_bytes();
}

absl::StatusOr<ArrayInfo> RemoteController::PutDirectly(ClientId client, SliceId slice,
                                                        const Sharding& sharding,
                                                        const ArraySpec& spec,
                                                        const uint8_t* bytes) {
  PW_ASSIGN_OR_RETURN(DirectPut put, BeginPut(client, slice, sharding, spec).Await());
  absl::Status sent = core_->io.Send(spec, bytes, sharding, put.shards);
  if (!sent.ok()) {
    (void)ReleaseArray(client, put.info.id);  // Never the caller's: it goes now.
    return Annotate(sent, absl::StrCat("putting ", spec.ToString(), " as ",
                                       put.info.id.ToString()));
  }
  return put.info;
}

absl::StatusOr<ArrayInfo> RemoteController::PutArrayFrom(ClientId client, SliceId slice,
                                                         const Sharding& sharding,
                                                         const ArraySpec& spec,
                                                         absl::Span<const uint8_t> bytes) {
  if (SendsDirectly(spec, bytes.size()))
    return PutDirectly(client, slice, sharding, spec, bytes.data());
  return ControllerInterface::PutArrayFrom(client, slice, sharding, spec, bytes);
}

absl::StatusOr<ArrayInfo> RemoteController::PutArray(ClientId client, SliceId slice,
                                                     const Sharding& sharding, HostArray value) {
  if (SendsDirectly(value.spec, value.bytes.size()))
    return PutDirectly(client, slice, sharding, value.spec, value.bytes.data());
  v1::PutArrayRequest req;
  req.set_client(client.value());
  req.set_slice(slice.value());
  ToProto(sharding, req.mutable_sharding());
  ToProto(value, req.mutable_value());
  v1::ArrayInfo resp;
  PW_CALL(PutArray, client, req, resp);
  return FromProto(resp);
}

bool RemoteController::Core::BeginRead(ClientId client, BufferId id) {
  pw::MutexLock lock(&mu);
  Reads& r = reads[{client, id}];
  if (r.releases > 0) return false;
  ++r.pending;
  return true;
}

void RemoteController::Core::EndRead(const std::shared_ptr<Core>& self, ClientId client,
                                     BufferId id) {
  int releases = 0;
  {
    pw::MutexLock lock(&mu);
    auto it = reads.find({client, id});
    if (it == reads.end() || --it->second.pending > 0) return;
    releases = it->second.releases;
    reads.erase(it);
  }
  // The deferred releases (their callers were already told OK).
  if (std::shared_ptr<ClientSession> session = self->SessionOf(client); session != nullptr)
    for (int i = 0; i < releases; ++i) session->Release(id);
}

absl::Status RemoteController::ReleaseArray(ClientId client, BufferId id) {
  {
    pw::MutexLock lock(&core_->mu);
    if (auto it = core_->reads.find({client, id}); it != core_->reads.end()) {
      ++it->second.releases;
      return absl::OkStatus();
    }
  }
  std::shared_ptr<ClientSession> session = core_->SessionOf(client);
  if (session == nullptr)
    return absl::FailedPreconditionError(
        absl::StrCat(client.ToString(), " is not connected through this RemoteController"));
  session->Release(id);  // In order after the runs that may read it.
  return absl::OkStatus();
}

absl::StatusOr<BufferId> RemoteController::ReserveBufferIds(ClientId client, int64_t count) {
  v1::ReserveBufferIdsRequest req;
  req.set_client(client.value());
  req.set_count(count);
  v1::BufferIdRange resp;
  PW_CALL(ReserveBufferIds, client, req, resp);
  return BufferId(resp.first());
}

absl::StatusOr<ArrayInfo> RemoteController::LoadArray(ClientId client, SliceId slice,
                                                      const Sharding& sharding,
                                                      const ArraySpec& spec,
                                                      const std::string& path) {
  v1::LoadArrayRequest req;
  req.set_client(client.value());
  req.set_slice(slice.value());
  ToProto(sharding, req.mutable_sharding());
  ToProto(spec, req.mutable_spec());
  req.set_path(path);
  v1::ArrayInfo resp;
  PW_CALL(LoadArray, client, req, resp);
  return FromProto(resp);
}

absl::StatusOr<std::string> RemoteController::CommitCheckpoint(
    ClientId client, const std::string& path,
    const std::vector<std::pair<std::string, std::string>>& files,
    const std::string& final_path) {
  v1::CommitCheckpointRequest req;
  req.set_client(client.value());
  req.set_path(path);
  req.set_final_path(final_path);
  for (const auto& [name, contents] : files) {
    v1::CheckpointFile* f = req.add_files();
    f->set_name(name);
    f->set_contents(contents);
  }
  v1::CheckpointPath resp;
  PW_CALL(CommitCheckpoint, client, req, resp);
  return resp.path();
}

absl::StatusOr<std::string> RemoteController::ShareArray(ClientId client, BufferId id,
                                                         const ShareOptions& options) {
  v1::ShareArrayRequest req;
  req.set_client(client.value());
  req.set_buffer(id.value());
  req.set_writable(options.writable);
  req.set_token(options.token);
  v1::ShareToken resp;
  PW_CALL(ShareArray, client, req, resp);
  return resp.token();
}

absl::StatusOr<ArrayInfo> RemoteController::ImportArray(ClientId client, const std::string& token) {
  v1::ShareRequest req;
  req.set_client(client.value());
  req.set_token(token);
  v1::ArrayInfo resp;
  PW_CALL(ImportArray, client, req, resp);
  return FromProto(resp);
}

absl::Status RemoteController::RevokeShare(ClientId client, const std::string& token) {
  v1::ShareRequest req;
  req.set_client(client.value());
  req.set_token(token);
  v1::Empty resp;
  PW_CALL(RevokeShare, client, req, resp);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RemoteController::StartTrace(ClientId client) {
  v1::ClientRequest req;
  req.set_client(client.value());
  v1::Clock resp;
  PW_CALL(StartTrace, client, req, resp);
  return resp.ns();
}

Future<trace::Chunk> RemoteController::StopTrace(ClientId client, bool all_tenants) {
  v1::StopTraceRequest req;
  req.set_client(client.value());
  req.set_all_tenants(all_tenants);
  v1::TraceChunk resp;
  auto call = [&]() -> absl::StatusOr<trace::Chunk> {
    PW_CALL(StopTrace, client, req, resp);
    return FromProto(resp);
  };
  return Future<trace::Chunk>::Ready(call());
}

#undef PW_CALL

namespace {
// An asynchronous call's state, kept alive until its callback has run.
template <typename Req, typename Resp>
struct AsyncCall {
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
};
}  // namespace

Future<RunInfo> RemoteController::Submit(ClientId client, ProgramId program,
                                         const std::vector<BufferId>& args,
                                         const RunOptions& options) {
  std::shared_ptr<ClientSession> session = core_->SessionOf(client);
  if (session == nullptr)
    return Future<RunInfo>::Ready(absl::FailedPreconditionError(
        absl::StrCat(client.ToString(), " is not connected through this RemoteController")));
  v1::SubmitRequest req;
  req.set_client(client.value());
  req.set_program(program.value());
  req.mutable_args()->Reserve(static_cast<int>(args.size()));
  for (BufferId a : args) req.add_args(a.value());
  ToProto(options, &req);
  return session->Submit(std::move(req));
}

namespace {
absl::StatusOr<std::vector<ShardTransfer>> FromProto(
    const google::protobuf::RepeatedPtrField<v1::ShardTransfer>& shards) {
  std::vector<ShardTransfer> out;
  for (const v1::ShardTransfer& t : shards) out.push_back({t.rank(), t.address(), t.key()});
  return out;
}
}  // namespace

Future<HostArray> RemoteController::FetchArray(ClientId client, BufferId id) {
  Promise<HostArray> p;
  Future<HostArray> result = p.future();
  LocateArray(client, id, !direct_io())
      .OnReady([core = core_, p = std::move(p), id](const absl::StatusOr<LocatedArray>& a) mutable {
        if (!a.ok()) return p.Set(a.status());
        if (a->value.has_value()) return p.Set(*a->value);
        auto shared = std::make_shared<Promise<HostArray>>(std::move(p));
        core->io.Read(a->spec, a->sharding, a->shards,
                      [shared, id](absl::StatusOr<HostArray> got) {
                        if (!got.ok())
                          return shared->Set(Annotate(got.status(),
                                                      absl::StrCat("fetching ", id.ToString())));
                        shared->Set(std::move(got));
                      });
      });
  return result;
}

Future<DirectPut> RemoteController::BeginPut(ClientId client, SliceId slice,
                                             const Sharding& sharding, const ArraySpec& spec) {
  auto call = std::make_shared<AsyncCall<v1::BeginPutRequest, v1::DirectPut>>();
  core_->Prepare(&call->ctx, client);
  call->req.set_client(client.value());
  call->req.set_slice(slice.value());
  ToProto(sharding, call->req.mutable_sharding());
  ToProto(spec, call->req.mutable_spec());
  auto promise = std::make_shared<Promise<DirectPut>>();
  Future<DirectPut> result = promise->future();
  core_->stub->async()->BeginPut(&call->ctx, &call->req, &call->resp,
                                 [core = core_, call, promise](grpc::Status s) {
                                   if (!s.ok()) return promise->Set(core->Where(s));
                                   absl::StatusOr<ArrayInfo> info = FromProto(call->resp.info());
                                   if (!info.ok()) return promise->Set(info.status());
                                   promise->Set(DirectPut{*info, *FromProto(call->resp.shards())});
                                 });
  return result;
}

Future<LocatedArray> RemoteController::LocateArray(ClientId client, BufferId id,
                                                   bool inline_only) {
  auto call = std::make_shared<AsyncCall<v1::LocateArrayRequest, v1::LocatedArray>>();
  core_->Prepare(&call->ctx, client);
  call->req.set_client(client.value());
  call->req.set_buffer(id.value());
  call->req.set_inline_only(inline_only);
  auto promise = std::make_shared<Promise<LocatedArray>>();
  Future<LocatedArray> result = promise->future();
  if (!core_->BeginRead(client, id))
    return Future<LocatedArray>::Ready(absl::NotFoundError(
        absl::StrCat(id.ToString(), " was released by ", client.ToString())));
  core_->stub->async()->LocateArray(
      &call->ctx, &call->req, &call->resp, [core = core_, call, promise, client, id](grpc::Status s) {
        core->EndRead(core, client, id);
        if (!s.ok()) return promise->Set(core->Where(s));
        LocatedArray out;
        absl::StatusOr<ArraySpec> spec = FromProto(call->resp.spec());
        absl::StatusOr<Sharding> sharding = FromProto(call->resp.sharding());
        if (!spec.ok()) return promise->Set(spec.status());
        if (!sharding.ok()) return promise->Set(sharding.status());
        out.spec = *spec;
        out.sharding = *sharding;
        if (call->resp.has_value()) {
          absl::StatusOr<HostArray> v = FromProto(call->resp.mutable_value());
          if (!v.ok()) return promise->Set(v.status());
          out.value = *std::move(v);
        }
        out.shards = *FromProto(call->resp.shards());
        promise->Set(std::move(out));
      });
  return result;
}

Future<> RemoteController::SaveArray(ClientId client, BufferId id, const std::string& path) {
  auto call = std::make_shared<AsyncCall<v1::SaveArrayRequest, v1::Empty>>();
  core_->Prepare(&call->ctx, client);
  call->req.set_client(client.value());
  call->req.set_buffer(id.value());
  call->req.set_path(path);
  auto promise = std::make_shared<Promise<>>();
  Future<> result = promise->future();
  if (!core_->BeginRead(client, id))
    return Future<>::Ready(absl::NotFoundError(
        absl::StrCat(id.ToString(), " was released by ", client.ToString())));
  core_->stub->async()->SaveArray(&call->ctx, &call->req, &call->resp,
                                  [core = core_, call, promise, client, id](grpc::Status s) {
                                    core->EndRead(core, client, id);
                                    promise->Set(s.ok() ? absl::OkStatus() : core->Where(s));
                                  });
  return result;
}

Future<> RemoteController::ArrayReady(ClientId client, BufferId id) {
  auto call = std::make_shared<AsyncCall<v1::ArrayRequest, v1::Empty>>();
  core_->Prepare(&call->ctx, client);
  call->req.set_client(client.value());
  call->req.set_buffer(id.value());
  auto promise = std::make_shared<Promise<>>();
  Future<> result = promise->future();
  if (!core_->BeginRead(client, id))
    return Future<>::Ready(absl::NotFoundError(
        absl::StrCat(id.ToString(), " was released by ", client.ToString())));
  core_->stub->async()->ArrayReady(&call->ctx, &call->req, &call->resp,
                                   [core = core_, call, promise, client, id](grpc::Status s) {
                                     core->EndRead(core, client, id);
                                     promise->Set(s.ok() ? absl::OkStatus() : core->Where(s));
                                   });
  return result;
}

absl::StatusOr<v1::ClusterStatus> RemoteController::FullStatus(bool reset_peak_memory) {
  grpc::ClientContext ctx;
  AddToken(&ctx, core_->options.token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::StatusRequest req;
  req.set_reset_peak_memory(reset_peak_memory);
  v1::ClusterStatus resp;
  if (grpc::Status s = core_->stub->Status(&ctx, req, &resp); !s.ok()) return core_->Where(s);
  return resp;
}

absl::StatusOr<ClusterStatus> RemoteController::Status() {
  PW_ASSIGN_OR_RETURN(v1::ClusterStatus s, FullStatus());
  return FromProto(s);
}

absl::Status RemoteController::SetTenant(const TenantSettings& settings) {
  v1::TenantSettings req;
  req.set_name(settings.name);
  if (settings.share.has_value()) req.set_share(*settings.share);
  if (settings.memory_bytes.has_value()) req.set_memory_bytes(*settings.memory_bytes);
  grpc::ClientContext ctx;
  AddToken(&ctx, core_->options.token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::Empty resp;
  if (grpc::Status s = core_->stub->SetTenant(&ctx, req, &resp); !s.ok()) return core_->Where(s);
  return absl::OkStatus();
}

absl::Status RemoteController::Shutdown() {
  grpc::ClientContext ctx;
  AddToken(&ctx, core_->options.token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::Empty req, resp;
  if (grpc::Status s = core_->stub->Shutdown(&ctx, req, &resp); !s.ok()) return core_->Where(s);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RunId>> RemoteController::CancelWith(const v1::CancelRequest& req) {
  grpc::ClientContext ctx;
  AddToken(&ctx, core_->options.token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CancelResponse resp;
  if (grpc::Status s = core_->stub->Cancel(&ctx, req, &resp); !s.ok()) return core_->Where(s);
  std::vector<RunId> runs;
  for (int64_t r : resp.runs()) runs.push_back(RunId(r));
  return runs;
}

absl::StatusOr<std::vector<RunId>> RemoteController::CancelRun(RunId run,
                                                               const std::string& reason) {
  v1::CancelRequest req;
  req.set_run(run.value());
  req.set_reason(reason);
  return CancelWith(req);
}

absl::StatusOr<std::vector<RunId>> RemoteController::CancelClient(ClientId client,
                                                                  const std::string& reason) {
  v1::CancelRequest req;
  req.set_client(client.value());
  req.set_reason(reason);
  return CancelWith(req);
}

}  // namespace pw::rpc
