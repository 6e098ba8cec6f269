#include "pw/rpc/remote_worker.h"

#include <cstring>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "grpcpp/alarm.h"
#include "pw/base/check.h"
#include "pw/base/status_macros.h"
#include "pw/dataplane/shm_segment.h"
#include "pw/rpc/batch_queue.h"
#include "pw/rpc/mail.h"
#include "pw/rpc/reactors.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {
namespace v1 = ::pathways::v1;

namespace {
constexpr auto kControlDeadline = std::chrono::seconds(30);

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + kControlDeadline;
}
}  // namespace

// The command stream: commands are written from a queue, those queued during a write together
// in the next (BatchQueue); events are read until the stream ends. A command that can wait
// (WriteLazy) starts no write of its own: it goes in the next one, or after the owner's
// lazy_flush if none comes sooner (an alarm). A hold keeps the call open until the read side has
// ended and no write or alarm is outstanding, so Write never reaches a finished call; writes
// after that are dropped (the owner fails their commands).
class RemoteWorker::Stream final
    : public grpc::ClientBidiReactor<v1::CommandBatch, v1::CommandEventBatch> {
 public:
  // `first_seq`: the seq of the first command it carries (a mail stream says it).
  Stream(RemoteWorker* owner, uint64_t first_seq) : owner_(owner) {
    AddToken(&ctx_, owner->options_.token);
    if (owner->mail_commands_) {
      ctx_.AddMetadata(kMailStub, absl::StrCat(owner->mail_id_));
      ctx_.AddMetadata(kMailFirstSeq, absl::StrCat(first_seq));
      ctx_.AddMetadata(kReplyMailbox, owner->self_mailbox_);
    }
    owner->stub_->async()->Commands(&ctx_, this);
    AddHold();
    StartRead(&events_);
    StartCall();
  }

  // gRPC calls are made without holding mu_: a reaction may run inline.
  void Write(v1::Command c) { WriteAll(absl::MakeSpan(&c, 1)); }
  // Commands (moved from) that go in one write (unless one is under way: then all go in the
  // next).
  void WriteAll(absl::Span<v1::Command> cs) {
    v1::CommandBatch* first = nullptr;
    {
      pw::MutexLock lock(&mu_);
      if (closed_) return;
      for (v1::Command& c : cs) queue_.Push(std::move(c));
      first = NextToWriteLocked();
    }
    if (first != nullptr) StartWrite(first);
  }
  void WriteLazy(v1::Command c) {
    pw::MutexLock lock(&mu_);
    if (closed_) return;
    queue_.Push(std::move(c));
    // A write under way is followed by the next (this goes in it); an armed alarm flushes it.
    if (queue_.writing() || alarm_armed_) return;
    alarm_armed_ = true;
    // Its callback runs later, on a gRPC thread (never inline): safe under mu_.
    alarm_.Set(absl::ToChronoTime(absl::Now() + owner_->lazy_flush_), [this](bool) { OnAlarm(); });
  }
  void Cancel() { ctx_.TryCancel(); }

  // The worker's initial metadata: whether it takes this stream's commands by mail.
  void OnReadInitialMetadataDone(bool ok) override {
    if (!ok || !owner_->mail_commands_) return;
    const auto& md = ctx_.GetServerInitialMetadata();
    auto it = md.find(kMailOk);
    if (it == md.end() || it->second != "1") return;
    v1::CommandBatch* next = nullptr;
    bool more = false;
    {
      pw::MutexLock lock(&mu_);
      mail_ok_ = true;
      if (!closed_) {
        next = NextToWriteLocked();
        more = queue_.more();
      }
    }
    if (next != nullptr) StartWrite(next, Coalesced(more));
  }

  void OnWriteDone(bool ok) override {
    v1::CommandBatch* next = nullptr;
    bool release = false, more = false;
    {
      pw::MutexLock lock(&mu_);
      queue_.WriteDone();
      if (!ok) queue_.DropWaiting();  // The stream is broken; OnDone reports why.
      next = NextToWriteLocked();
      more = queue_.more();
      release = ReleaseLocked();
    }
    if (next != nullptr) StartWrite(next, Coalesced(more));
    if (release) RemoveHold();
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // The stream is over: no more writes; OnDone follows the hold's release.
      bool release = false;
      {
        pw::MutexLock lock(&mu_);
        closed_ = true;
        queue_.DropWaiting();  // Not the batch being written: gRPC still reads it.
        if (alarm_armed_) alarm_.Cancel();  // OnAlarm follows, on another thread.
        release = ReleaseLocked();
      }
      if (release) RemoveHold();
      return;
    }
    for (const v1::CommandEvent& e : events_.items()) owner_->OnEvent(e);
    events_.Clear();
    StartRead(&events_);
  }
  void OnDone(const grpc::Status& s) override {
    absl::Status status = FromGrpc(s);
    if (status.ok()) status = absl::UnavailableError("the worker closed the command stream");
    owner_->OnStreamEnd(this, status);
    delete this;
  }

 private:
  // Writes what waits, unless a write is under way (it will) or the stream is over.
  void OnAlarm() {
    v1::CommandBatch* next = nullptr;
    bool release = false, more = false;
    {
      pw::MutexLock lock(&mu_);
      alarm_armed_ = false;
      if (!closed_) {
        next = NextToWriteLocked();
        more = queue_.more();
      }
      release = ReleaseLocked();
    }
    if (next != nullptr) StartWrite(next, Coalesced(more));
    if (release) RemoveHold();
  }
  // The next batch to write on the stream, marked as being written, or null. Once the worker
  // takes mail, batches go to its mailbox instead (at once, in order: the worker orders them
  // with those of the stream by seq); one that does not fit goes on the stream.
  v1::CommandBatch* NextToWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (true) {
      v1::CommandBatch* next = queue_.StartNext();
      if (next == nullptr || !mail_ok_) return next;
      v1::PeerMail mail;
      v1::MailedCommands* m = mail.mutable_commands();
      m->set_stub(owner_->mail_id_);
      m->mutable_commands()->Swap(next->mutable_items());
      if (!owner_->send_to_worker_(mail)) {
        m->mutable_commands()->Swap(next->mutable_items());
        return next;
      }
      owner_->commands_mailed_.fetch_add(m->commands_size(), std::memory_order_relaxed);
      queue_.WriteDone();
    }
  }

  RemoteWorker* const owner_;
  grpc::ClientContext ctx_;
  v1::CommandEventBatch events_;
  grpc::Alarm alarm_;
  pw::Mutex mu_;
  // Whether the hold should go now (closed, no write or alarm outstanding); true once.
  bool ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!closed_ || queue_.writing() || alarm_armed_ || released_) return false;
    released_ = true;
    return true;
  }
  BatchQueue<v1::CommandBatch> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool alarm_armed_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool mail_ok_ ABSL_GUARDED_BY(mu_) = false;  // The worker takes this stream's mail.
};

namespace {
// The bulk stream's TLS for `options` (null: plaintext). Its files were checked when loaded.
std::shared_ptr<const dataplane::TlsContext> BulkTls(const ChannelOptions& options) {
  if (options.tls == nullptr) return nullptr;
  auto ctx = dataplane::TlsContext::Create(*options.tls, /*server=*/false);
  return ctx.ok() ? *std::move(ctx) : nullptr;
}
}  // namespace

RemoteWorker::RemoteWorker(HostId host, std::string address, const ChannelOptions& options,
                           bool same_machine, absl::Duration lazy_flush)
    : host_(host),
      address_(std::move(address)),
      options_(options),
      lazy_flush_(lazy_flush),
      data_plane_(same_machine ? dataplane::PeerChannel::SharedMemory()
                               : dataplane::PeerChannel::Bulk(HostOf(address_), options.token,
                                                              BulkTls(options))),
      channel_(MakeChannel(address_, options)),
      stub_(v1::Worker::NewStub(channel_)),
      mail_id_(NewMailId()) {}

void RemoteWorker::UseMailboxes(HostId self, std::string self_mailbox,
                                std::function<bool(const v1::PeerMail&)> send_to_worker) {
  // Mailed fetches take seqs that a mail stream would wait for.
  PW_CHECK(!mail_commands_, "UseMailboxes on a stub that mails its commands");
  send_to_worker_ = std::move(send_to_worker);
  self_mailbox_ = std::move(self_mailbox);
  reply_host_.store(self.value(), std::memory_order_relaxed);
}

void RemoteWorker::MailCommands(std::string self_mailbox,
                                std::function<bool(const v1::PeerMail&)> send_to_worker) {
  PW_CHECK(reply_host_.load(std::memory_order_relaxed) < 0,
           "MailCommands on a stub that mails fetches (UseMailboxes)");
  send_to_worker_ = std::move(send_to_worker);
  self_mailbox_ = std::move(self_mailbox);
  mail_commands_ = true;
}

void RemoteWorker::OnMailedEvents(const v1::MailedEvents& mail) {
  if (mail.from_host() != host_.value() || mail.stub() != mail_id_) return;  // Not ours.
  for (const v1::CommandEvent& e : mail.events()) OnEvent(e);
}

RemoteWorker::~RemoteWorker() {
  Fail("the controller closed its connection");
  {
    pw::MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stream_ == nullptr; });
  }
  // Calls cancelled by Fail end soon: their callbacks must not outlive the stub's channel.
  pw::MutexLock lock(&fetches_->mu);
  fetches_->mu.Await([f = fetches_.get()]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return f->calls.empty();
  });
}

std::string RemoteWorker::Where() const { return absl::StrCat(host_.ToString(), " at ", address_); }

absl::Status RemoteWorker::Where(const absl::Status& s) const { return Annotate(s, Where()); }

void RemoteWorker::Fail(const std::string& reason) {
  absl::flat_hash_map<uint64_t, Pending> pending;
  {
    pw::MutexLock lock(&mu_);
    if (failed_.empty()) failed_ = reason;
    pending.swap(pending_);
    if (stream_ != nullptr) stream_->Cancel();
  }
  {
    pw::MutexLock lock(&fetches_->mu);
    if (fetches_->failed.empty()) fetches_->failed = reason;
    for (grpc::ClientContext* call : fetches_->calls) call->TryCancel();  // OnDone runs later.
  }
  // This stub may be kept (work in flight holds it), but its shared memory is of no more use.
  data_plane_->Close();
  const absl::Status error = Where(absl::UnavailableError(reason));
  for (auto& [seq, p] : pending) FailPending(p, error);
}

void RemoteWorker::FailPending(Pending& p, const absl::Status& error) {
  if (p.enqueued.valid()) p.enqueued.Set(error);
  if (p.done.valid()) p.done.Set(error);
  if (p.ran.has_value() && p.ran->valid()) p.ran->Set(error);
  if (p.fetched.has_value() && p.fetched->valid()) p.fetched->Set(error);
  if (p.transfer.has_value() && p.transfer->valid()) p.transfer->Set(error);
}

void RemoteWorker::Send(v1::Command c, Pending p, const HostProgram* program) {
  std::string failed;
  {
    pw::MutexLock lock(&mu_);
    if (failed_.empty()) {
      OpenStreamLocked();
      // A dispatch's program body goes with the first dispatch of it on this stream; the stream
      // delivers in order, so later ones find it cached. Decided with the write, under one
      // lock, so an Unload (which makes the body go again) cannot slip between.
      if (program != nullptr && programs_sent_.insert(program->id).second)
        ToProto(*program, c.mutable_dispatch()->mutable_program());
      const uint64_t seq = next_seq_++;
      c.set_seq(seq);
      pending_.emplace(seq, std::move(p));
      stream_->Write(std::move(c));
      return;
    }
    failed = failed_;
  }
  FailPending(p, Where(absl::UnavailableError(failed)));
}

void RemoteWorker::SendAll(std::vector<std::pair<v1::Command, Pending>> commands) {
  std::string failed;
  {
    pw::MutexLock lock(&mu_);
    if (failed_.empty()) {
      OpenStreamLocked();
      std::vector<v1::Command> batch;
      for (auto& [c, p] : commands) {
        const uint64_t seq = next_seq_++;
        c.set_seq(seq);
        pending_.emplace(seq, std::move(p));
        batch.push_back(std::move(c));
      }
      stream_->WriteAll(absl::MakeSpan(batch));
      return;
    }
    failed = failed_;
  }
  for (auto& [c, p] : commands) FailPending(p, Where(absl::UnavailableError(failed)));
}

void RemoteWorker::OnEvent(const v1::CommandEvent& e) {
  const absl::Status s = e.has_status() ? Where(FromProto(e.status())) : absl::OkStatus();
  Pending p;
  {
    pw::MutexLock lock(&mu_);
    auto it = pending_.find(e.seq());
    if (it == pending_.end()) return;
    if (e.kind() == v1::CommandEvent::ENQUEUED) {
      p.enqueued = std::move(it->second.enqueued);
      if (it->second.transfer.has_value()) {
        p.transfer = std::move(it->second.transfer);
        p.key = it->second.key;
        it->second.transfer.reset();
      }
    } else {
      p = std::move(it->second);
      pending_.erase(it);
    }
  }
  if (p.fetched.has_value()) return Fetched(std::move(p), e, s);
  if (p.transfer.has_value()) Transferred(p, e, s);
  if (p.enqueued.valid()) {
    // A dispatch acknowledged with its end says how long before it the work was enqueued (a
    // failed run's work may well have been).
    const absl::Time now = absl::Now();
    if (e.has_enqueued_before_ns())
      p.enqueued.Set(std::clamp(now - absl::Nanoseconds(e.enqueued_before_ns()),
                                std::min(p.sent, now), now));
    else if (!s.ok()) p.enqueued.Set(s);
    else p.enqueued.Set(now);
  }
  if (e.kind() != v1::CommandEvent::DONE) return;
  if (p.done.valid()) p.done.Set(s);
  if (p.ran.has_value()) {
    if (!s.ok()) return p.ran->Set(s);
    p.ran->Set(e.device_ns());
  }
}

void RemoteWorker::Fetched(Pending p, const v1::CommandEvent& e, const absl::Status& s) {
  Promise<DeviceBufferRef>& fetched = *p.fetched;
  if (!s.ok()) return fetched.Set(s);
  if (e.too_large()) return FetchLarge(p.buffer, p.device, std::move(fetched));
  absl::StatusOr<ArraySpec> spec = FromProto(e.shard().spec());
  if (!spec.ok()) return fetched.Set(Annotate(spec.status(), FetchWhere(p.buffer, p.device)));
  if (static_cast<size_t>(spec->size_bytes()) != e.shard().data().size())
    return fetched.Set(absl::DataLossError(absl::StrCat(
        FetchWhere(p.buffer, p.device), ": the shard came with ", e.shard().data().size(),
        " bytes, its spec says ", spec->size_bytes())));
  std::shared_ptr<HostDeviceBuffer> buffer = HostDeviceBuffer::Create(*spec, p.device);
  std::memcpy(buffer->mutable_data(), e.shard().data().data(), e.shard().data().size());
  fetched.Set(DeviceBufferRef(std::move(buffer)));
}

void RemoteWorker::Transferred(Pending& p, const v1::CommandEvent& e,
                               const absl::Status& s) const {
  if (!p.transfer->valid()) return;
  if (!s.ok()) return p.transfer->Set(s);
  if (e.bulk_port() <= 0 || e.bulk_port() > 65535)
    return p.transfer->Set(Where(absl::DataLossError(
        absl::StrCat("a client transfer answered with bulk port ", e.bulk_port()))));
  const std::string host = HostOf(address_);
  const bool v6 = host.find(':') != std::string::npos;
  p.transfer->Set(ShardTransfer{0, absl::StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", e.bulk_port()),
                                p.key});
}

void RemoteWorker::OnStreamEnd(Stream* stream, const absl::Status& s) {
  absl::flat_hash_map<uint64_t, Pending> pending;
  std::string reason;
  {
    pw::MutexLock lock(&mu_);
    if (failed_.empty()) failed_ = absl::StrCat("connection lost (", s.message(), ")");
    reason = failed_;
    pending.swap(pending_);
  }
  // A refusal (a wrong cluster token) says so; anything else is the worker being unreachable.
  const absl::Status error =
      absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s)
          ? Where(s)
          : Where(absl::UnavailableError(reason));
  for (auto& [seq, p] : pending) FailPending(p, error);
  // Last: the destructor waits for this, so nothing above may run after it.
  pw::MutexLock lock(&mu_);
  if (stream_ == stream) stream_ = nullptr;
}

void RemoteWorker::OpenStreamLocked() {
  if (stream_ != nullptr) return;
  programs_sent_.clear();
  stream_ = new Stream(this, next_seq_);
}

void RemoteWorker::OpenCommandStream() {
  pw::MutexLock lock(&mu_);
  if (failed_.empty()) OpenStreamLocked();
}

std::string RemoteWorker::failure() const {
  pw::MutexLock lock(&mu_);
  return failed_;
}

DispatchAck RemoteWorker::Dispatch(HostWork work) {
  Pending p;
  p.ran.emplace();
  p.sent = absl::Now();
  DispatchAck ack{p.enqueued.future(), p.ran->future()};
  v1::Command c;
  v1::DispatchRequest* d = c.mutable_dispatch();
  d->set_ack_enqueue_with_done(!work.ack_enqueue_at_once);
  d->set_program_id(work.program->id);
  d->set_run(work.run.value());
  d->set_client(work.client.value());
  d->set_begin(work.begin);
  d->set_end(work.end);
  d->mutable_buffers()->Reserve(static_cast<int>(work.buffers->size()));
  for (BufferId b : *work.buffers) d->add_buffers(b.value());
  Send(std::move(c), std::move(p), work.program.get());
  return ack;
}

Future<> RemoteWorker::PutShard(BufferId id, DeviceId device, HostArray shard) {
  Pending p;
  Future<> done = p.done.future();
  v1::Command c;
  v1::PutShardRequest* put = c.mutable_put_shard();
  put->set_buffer(id.value());
  put->set_device(device.value());
  ToProto(shard, put->mutable_shard());
  Bytes().swap(shard.bytes);  // Copied: freed before gRPC makes its own copy.
  Send(std::move(c), std::move(p));
  return done;
}

void RemoteWorker::DeleteBuffers(const std::vector<BufferId>& ids) {
  v1::Command c;
  for (BufferId b : ids) c.mutable_delete_buffers()->add_buffers(b.value());
  SendUnacknowledged(std::move(c), /*lazy=*/true);
}

void RemoteWorker::Unload(const std::vector<FunctionId>& functions,
                          const std::vector<uint64_t>& host_programs) {
  v1::Command c;
  for (FunctionId f : functions) c.mutable_unload()->add_functions(f.value());
  for (uint64_t p : host_programs) c.mutable_unload()->add_host_programs(p);
  {
    // A program sent again later (never: its client is gone) would carry its body again.
    pw::MutexLock lock(&mu_);
    for (uint64_t p : host_programs) programs_sent_.erase(p);
  }
  SendUnacknowledged(std::move(c));
}

void RemoteWorker::CancelRuns(const std::vector<RunId>& runs, const absl::Status& reason) {
  v1::Command c;
  for (RunId r : runs) c.mutable_cancel_runs()->add_runs(r.value());
  ToProto(reason, c.mutable_cancel_runs()->mutable_reason());
  SendUnacknowledged(std::move(c));
}

void RemoteWorker::SetHosts(const v1::HostTable& table) {
  v1::Command c;
  *c.mutable_hosts() = table;
  SendUnacknowledged(std::move(c));
}

void RemoteWorker::ForgetRuns(const std::vector<RunId>& runs) {
  v1::Command c;
  for (RunId r : runs) c.mutable_forget_runs()->add_runs(r.value());
  SendUnacknowledged(std::move(c), /*lazy=*/true);
}

void RemoteWorker::SendUnacknowledged(v1::Command c, bool lazy) {
  pw::MutexLock lock(&mu_);
  if (!failed_.empty()) return;  // The worker is gone, and with it its buffers and runs.
  OpenStreamLocked();
  c.set_seq(next_seq_++);
  if (lazy) return stream_->WriteLazy(std::move(c));
  stream_->Write(std::move(c));
}

namespace {
// One unary call to a worker made without waiting: `start` issues it on the call's context,
// request and response; the future holds `finish(response)`, or the call's error annotated with
// `where`. Nothing of the RemoteWorker is used after `start` returns.
// `calls` lists it while it is in flight (the RemoteWorker's destructor cancels and waits for
// what is listed).
template <typename T, typename Req, typename Resp, typename Start, typename Finish>
Future<T> UnaryCall(const std::shared_ptr<RemoteWorker::Fetches>& calls, Req req,
                    std::chrono::system_clock::time_point deadline, const std::string& token,
                    std::string where, Start start, Finish finish) {
  struct Call {
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
    Promise<T> done;
  };
  auto call = std::make_shared<Call>();
  call->req = std::move(req);
  AddToken(&call->ctx, token);
  call->ctx.set_deadline(deadline);
  Future<T> result = call->done.future();
  {
    pw::MutexLock lock(&calls->mu);
    if (!calls->failed.empty()) {  // Destroyed or failed: nothing more goes out.
      call->done.Set(Annotate(absl::UnavailableError(calls->failed), where));
      return result;
    }
    calls->calls.insert(&call->ctx);
  }
  start(&call->ctx, &call->req, &call->resp,
        [call, calls, where = std::move(where), finish = std::move(finish)](grpc::Status g) {
          absl::Status s = FromGrpc(g);
          if (!s.ok()) call->done.Set(Annotate(s, where));
          else call->done.Set(finish(call->resp));
          pw::MutexLock lock(&calls->mu);
          calls->calls.erase(&call->ctx);
        });
  return result;
}
std::chrono::system_clock::time_point In(std::chrono::seconds d) {
  return std::chrono::system_clock::now() + d;
}
}  // namespace

Future<> RemoteWorker::LoadFunction(FunctionId id, const FunctionDef& def) {
  v1::WorkerLoadFunctionRequest req;
  req.set_function(id.value());
  ToProto(def, req.mutable_def());
  return UnaryCall<void, v1::WorkerLoadFunctionRequest, v1::Empty>(
      fetches_, std::move(req), Deadline(), options_.token, Where(), 
      [stub = stub_.get()](auto* ctx, auto* req, auto* resp, auto done) {
        stub->async()->LoadFunction(ctx, req, resp, std::move(done));
      },
      [](const v1::Empty&) { return absl::OkStatus(); });
}

Future<> RemoteWorker::RemoveDevice(DeviceId device, const absl::Status& reason) {
  v1::RemoveDeviceRequest req;
  req.set_device(device.value());
  ToProto(reason, req.mutable_reason());
  return UnaryCall<void, v1::RemoveDeviceRequest, v1::Empty>(
      fetches_, std::move(req), In(std::chrono::seconds(5)), options_.token, Where(),
      [stub = stub_.get()](auto* ctx, auto* req, auto* resp, auto done) {
        stub->async()->RemoveDevice(ctx, req, resp, std::move(done));
      },
      [](const v1::Empty&) { return absl::OkStatus(); });
}

Future<> RemoteWorker::RestoreDevice(DeviceId device) {
  v1::RemoveDeviceRequest req;
  req.set_device(device.value());
  return UnaryCall<void, v1::RemoveDeviceRequest, v1::Empty>(
      fetches_, std::move(req), In(std::chrono::seconds(5)), options_.token, Where(),
      [stub = stub_.get()](auto* ctx, auto* req, auto* resp, auto done) {
        stub->async()->RestoreDevice(ctx, req, resp, std::move(done));
      },
      [](const v1::Empty&) { return absl::OkStatus(); });
}

Future<HostStatus> RemoteWorker::Status() const {
  return UnaryCall<HostStatus, v1::Empty, v1::HostStatus>(
      fetches_, v1::Empty(), In(std::chrono::seconds(3)), options_.token, Where(),
      [stub = stub_.get()](auto* ctx, auto* req, auto* resp, auto done) {
        stub->async()->Status(ctx, req, resp, std::move(done));
      },
      [where = Where()](const v1::HostStatus& resp) -> absl::StatusOr<HostStatus> {
        absl::StatusOr<HostStatus> h = FromProto(resp);
        if (!h.ok()) return Annotate(h.status(), where);
        return h;
      });
}

absl::StatusOr<trace::Chunk> RemoteWorker::Trace(bool start) {
  grpc::ClientContext ctx;
  AddToken(&ctx, options_.token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::WorkerTraceRequest req;
  req.set_start(start);
  v1::TraceChunk resp;
  if (absl::Status s = FromGrpc(stub_->Trace(&ctx, req, &resp)); !s.ok()) return Where(s);
  absl::StatusOr<trace::Chunk> c = FromProto(resp);
  if (!c.ok()) return Where(c.status());
  return c;
}

// ---------------------------------------------------------------- the data plane's write side

namespace {
// Reads one shard into a host-memory buffer: from its chunks, or from where a chunk says its
// bytes are on the peer's data plane (pw/dataplane: shared memory, or the bulk stream, whose
// read runs beside the call); the fetch completes once both have ended.
class FetchCall final : public grpc::ClientReadReactor<v1::ShardChunk> {
 public:
  FetchCall(v1::Worker::Stub* stub, const std::string& token, BufferId id, DeviceId device,
            std::shared_ptr<dataplane::PeerChannel> channel, std::string where,
            Promise<DeviceBufferRef> promise, std::shared_ptr<RemoteWorker::Fetches> fetches)
      : device_(device),
        where_(std::move(where)),
        promise_(std::move(promise)),
        fetch_(dataplane::PeerChannel::Begin(std::move(channel))),
        fetches_(std::move(fetches)) {
    AddToken(&ctx_, token);
    {
      // Registered before the call starts (once started it may end at any time).
      pw::MutexLock lock(&fetches_->mu);
      if (fetches_->failed.empty()) {
        fetches_->calls.insert(&ctx_);
      } else {
        ctx_.TryCancel();  // The worker failed already: the call ends as soon as it starts.
      }
    }
    req_.set_buffer(id.value());
    req_.set_device(device.value());
    if (fetch_->medium() == dataplane::Medium::kSharedMemory) {
      req_.mutable_shared_memory()->set_dest(fetch_->offered());
    } else {
      req_.mutable_bulk();
    }
    stub->async()->FetchShard(&ctx_, &req_, this);
    // Held for a read from the data plane (a hold must be added before StartCall): released
    // when the read ends, or when the stream ends without one.
    AddHold();
    StartRead(&chunk_);
    StartCall();  // From here on the call may end (and delete this) on another thread.
  }
  void OnReadDone(bool ok) override {
    if (!ok) return ReleaseUnusedHold();  // The stream's end.
    if (absl::Status s = Take(); !s.ok()) {
      if (error_.ok()) error_ = s;
      ctx_.TryCancel();
      return ReleaseUnusedHold();  // No more reads.
    }
    StartRead(&chunk_);
  }
  // After the stream's end and the data plane's read (whose hold delays this). The read's error
  // comes before the stream's, which is then only its cancellation.
  void OnDone(const grpc::Status& s) override {
    absl::Status status = error_;
    if (status.ok()) {
      pw::MutexLock lock(&mu_);
      status = read_status_;
    }
    if (status.ok()) status = FromGrpc(s);
    Complete(status);
  }

 private:
  void ReleaseUnusedHold() {
    if (!located_) {
      located_ = true;  // Released once.
      RemoveHold();
    }
  }
  void ReadDone(const absl::Status& s) {
    {
      pw::MutexLock lock(&mu_);
      read_status_ = s;
    }
    if (!s.ok()) ctx_.TryCancel();  // Else the call ends once the server saw the bytes read.
    RemoveHold();
  }

  // Sets the promise; deletes this.
  void Complete(absl::Status status) {
    {
      pw::MutexLock lock(&fetches_->mu);
      fetches_->calls.erase(&ctx_);
      // Cancelled because the worker failed (it stalled, or died): say so.
      if (!status.ok() && !fetches_->failed.empty())
        status = absl::UnavailableError(absl::StrCat("the worker failed: ", fetches_->failed,
                                                     " (", status.message(), ")"));
    }
    if (status.ok() && (buffer_ == nullptr || offset_ != static_cast<size_t>(buffer_->size_bytes())))
      status = absl::DataLossError(absl::StrCat("shard stream ended after ", offset_, " bytes"));
    if (status.ok()) {
      fetch_->Succeeded(offset_);
      promise_.Set(DeviceBufferRef(std::move(buffer_)));
    } else {
      promise_.Set(Annotate(status, where_));
    }
    delete this;
  }

  absl::Status Take() {
    if (!spec_.has_value()) {
      if (!chunk_.has_spec()) return absl::DataLossError("shard stream: first chunk has no spec");
      PW_ASSIGN_OR_RETURN(ArraySpec spec, FromProto(chunk_.spec()));
      spec_ = std::move(spec);
    }
    const size_t size = static_cast<size_t>(spec_->size_bytes());
    dataplane::ShardLocation location;
    switch (chunk_.location_case()) {
      case v1::ShardChunk::kData:
        if (buffer_ == nullptr) buffer_ = HostDeviceBuffer::Create(*spec_, device_);
        if (chunk_.data().size() > size - offset_)
          return absl::DataLossError(absl::StrCat("shard stream: more than ", size, " bytes"));
        std::memcpy(static_cast<char*>(buffer_->mutable_data()) + offset_, chunk_.data().data(),
                    chunk_.data().size());
        offset_ += chunk_.data().size();
        return absl::OkStatus();
      case v1::ShardChunk::kSharedMemory:
        location = dataplane::InSharedMemory{chunk_.shared_memory().segment(),
                                             chunk_.shared_memory().dest_error()};
        break;
      case v1::ShardChunk::kBulk:
        location = dataplane::OnBulkStream{chunk_.bulk().ticket(), chunk_.bulk().port()};
        break;
      case v1::ShardChunk::LOCATION_NOT_SET:
        return absl::DataLossError("shard stream: a chunk that names no location");
    }
    if (offset_ != 0 || located_) {
      if (chunk_.has_shared_memory())
        dataplane::UnlinkSharedMemory(chunk_.shared_memory().segment());
      return absl::DataLossError("shard stream: a location after data or another location");
    }
    offset_ = size;   // The read fills the buffer; any data chunk now is too much.
    located_ = true;  // The hold is ReadDone's to release.
    if (std::shared_ptr<void> memory = fetch_->Adopt(location, size); memory != nullptr) {
      buffer_ = HostDeviceBuffer::Adopt(*spec_, device_, std::move(memory));
      ReadDone(absl::OkStatus());
      return absl::OkStatus();
    }
    buffer_ = HostDeviceBuffer::Create(*spec_, device_);
    fetch_->Read(location, buffer_->mutable_data(), size,
                 [this](const absl::Status& s) { ReadDone(s); });
    return absl::OkStatus();
  }

  const DeviceId device_;
  const std::string where_;
  Promise<DeviceBufferRef> promise_;
  grpc::ClientContext ctx_;
  v1::ShardRequest req_;
  v1::ShardChunk chunk_;
  std::optional<ArraySpec> spec_;  // From the first chunk.
  std::shared_ptr<HostDeviceBuffer> buffer_;
  size_t offset_ = 0;
  absl::Status error_;  // Set by OnReadDone (gRPC serializes reactions).
  const std::unique_ptr<dataplane::PeerChannel::Fetch> fetch_;
  bool located_ = false;  // On gRPC's reactions only.
  const std::shared_ptr<RemoteWorker::Fetches> fetches_;
  pw::Mutex mu_;
  absl::Status read_status_ ABSL_GUARDED_BY(mu_);  // Written on a bulk reader's thread.
};
}  // namespace

Future<DeviceBufferRef> RemoteWorker::FetchShard(BufferId id, DeviceId device) {
  return FetchShards(id, {device})[0];
}

std::vector<Future<DeviceBufferRef>> RemoteWorker::FetchShards(
    BufferId id, const std::vector<DeviceId>& devices) {
  std::vector<Future<DeviceBufferRef>> shards;
  std::vector<std::pair<v1::Command, Pending>> fetches;
  const int64_t reply_host = reply_host_.load(std::memory_order_relaxed);
  for (DeviceId device : devices) {
    Pending p;
    p.fetched.emplace();
    p.buffer = id;
    p.device = device;
    shards.push_back(p.fetched->future());
    v1::Command c;
    c.mutable_fetch_shard()->set_buffer(id.value());
    c.mutable_fetch_shard()->set_device(device.value());
    if (reply_host >= 0) {
      c.mutable_fetch_shard()->set_reply_host(reply_host);
      c.mutable_fetch_shard()->set_reply_stub(mail_id_);
      c.mutable_fetch_shard()->set_reply_mailbox(self_mailbox_);
    }
    fetches.emplace_back(std::move(c), std::move(p));
  }
  if (reply_host >= 0 && send_to_worker_ != nullptr) {
    MailAll(std::move(fetches), reply_host);
  } else {
    SendAll(std::move(fetches));
  }
  return shards;
}

void RemoteWorker::MailAll(std::vector<std::pair<v1::Command, Pending>> commands,
                           int64_t reply_host) {
  v1::PeerMail mail;
  v1::MailedFetches* m = mail.mutable_fetches();
  m->set_from_host(reply_host);
  m->set_stub(mail_id_);
  m->set_reply_mailbox(self_mailbox_);
  std::string failed;
  {
    pw::MutexLock lock(&mu_);
    if (failed_.empty()) {
      OpenStreamLocked();  // Its end fails what is pending, mailed or not.
      for (auto& [c, p] : commands) {
        const uint64_t seq = next_seq_++;
        c.set_seq(seq);
        pending_.emplace(seq, std::move(p));
        *m->add_commands() = c;
      }
    } else {
      failed = failed_;
    }
  }
  if (!failed.empty()) {
    for (auto& [c, p] : commands) FailPending(p, Where(absl::UnavailableError(failed)));
    return;
  }
  if (send_to_worker_(mail)) return;
  // The mailbox is full: on the stream (if it ended meanwhile, what was pending failed).
  std::vector<v1::Command> batch;
  for (auto& [c, p] : commands) batch.push_back(std::move(c));
  pw::MutexLock lock(&mu_);
  if (stream_ != nullptr && failed_.empty()) stream_->WriteAll(absl::MakeSpan(batch));
}

UploadAck RemoteWorker::ExpectUpload(BufferId id, DeviceId device, const ArraySpec& spec) {
  Pending p;
  p.transfer.emplace();
  p.key = NewSecret();
  UploadAck ack{p.transfer->future(), p.done.future()};
  v1::Command c;
  v1::ClientTransferRequest* t = c.mutable_client_upload();
  t->set_buffer(id.value());
  t->set_device(device.value());
  ToProto(spec, t->mutable_spec());
  t->set_key(p.key);
  Send(std::move(c), std::move(p));
  return ack;
}

Future<ShardTransfer> RemoteWorker::OfferShard(BufferId id, DeviceId device) {
  Pending p;
  p.transfer.emplace();
  p.key = NewSecret();
  Future<ShardTransfer> f = p.transfer->future();
  v1::Command c;
  v1::ClientTransferRequest* t = c.mutable_client_fetch();
  t->set_buffer(id.value());
  t->set_device(device.value());
  t->set_key(p.key);
  Send(std::move(c), std::move(p));
  return f;
}

Future<> RemoteWorker::SaveShard(BufferId id, DeviceId device, const ShardFile& file) {
  Pending p;
  Future<> done = p.done.future();
  v1::Command c;
  v1::SaveShardRequest* r = c.mutable_save_shard();
  r->set_buffer(id.value());
  r->set_device(device.value());
  ToProto(file, r->mutable_file());
  Send(std::move(c), std::move(p));
  return done;
}

Future<> RemoteWorker::LoadShard(BufferId id, DeviceId device, const ArraySpec& spec,
                                 const ShardFile& file) {
  Pending p;
  Future<> done = p.done.future();
  v1::Command c;
  v1::LoadShardRequest* r = c.mutable_load_shard();
  r->set_buffer(id.value());
  r->set_device(device.value());
  ToProto(spec, r->mutable_spec());
  ToProto(file, r->mutable_file());
  Send(std::move(c), std::move(p));
  return done;
}

void RemoteWorker::FetchLarge(BufferId id, DeviceId device, Promise<DeviceBufferRef> p) {
  new FetchCall(stub_.get(), options_.token, id, device, data_plane_, FetchWhere(id, device),
                std::move(p), fetches_);
}

std::string RemoteWorker::FetchWhere(BufferId id, DeviceId device) const {
  return absl::StrCat("fetching ", id.ToString(), " on ", device.ToString(), " from ",
                      host_.ToString(), " at ", address_);
}

namespace {
// A unary call to the worker whose answer is only its outcome: `start(ctx, req, resp, done)`
// starts it; `done` gets OK or the error, annotated with `where`.
template <typename Request, typename Start>
void CallForOutcome(const std::string& token, const std::string& where, Request req,
                    Start start, std::function<void(const absl::Status&)> done) {
  struct Call {
    grpc::ClientContext ctx;
    Request req;
    v1::Empty resp;
  };
  auto call = std::make_shared<Call>();
  call->req = std::move(req);
  AddToken(&call->ctx, token);
  call->ctx.set_deadline(Deadline());
  start(&call->ctx, &call->req, &call->resp,
        [call, done = std::move(done), where](grpc::Status s) {
          done(s.ok() ? absl::OkStatus() : Annotate(FromGrpc(s), where));
        });
}
}  // namespace

void RemoteWorker::SendCollective(v1::CollectiveContribution c,
                                  std::function<void(const absl::Status&)> on_error) {
  CallForOutcome(
      options_.token, Where(), std::move(c),
      [this](auto* ctx, auto* req, auto* resp, auto cb) {
        stub_->async()->Collective(ctx, req, resp, std::move(cb));
      },
      [on_error = std::move(on_error)](const absl::Status& s) {
        if (!s.ok()) on_error(s);
      });
}

void RemoteWorker::SendMail(v1::PeerMail mail, std::function<void(const absl::Status&)> done) {
  CallForOutcome(
      options_.token, Where(), std::move(mail),
      [this](auto* ctx, auto* req, auto* resp, auto cb) {
        stub_->async()->Mail(ctx, req, resp, std::move(cb));
      },
      std::move(done));
}

}  // namespace pw::rpc
