// The controller's side of a client's Session stream: the client's runs and releases, in order,
// and the runs' acceptance and ends back. A client on the controller's machine may mail its
// batches and take its events by mail (ClientSession); its batches are handled in their order
// whichever way each came.
#include <atomic>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "pw/dataplane/shm_mailbox.h"
#include "pw/rpc/batch_queue.h"
#include "pw/rpc/controller_service.h"
#include "pw/rpc/mail.h"
#include "pw/rpc/reactors.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {
namespace v1 = ::pathways::v1;

namespace {
constexpr int kMaxBatchItems = BatchQueue<v1::SessionMessageBatch>::kMaxItems;
// Mailed batches waiting for those before them: past either, the session ends (a client that
// breaks the protocol must not grow the controller's memory). An honest client's wait behind
// one batch being handled, or one on its way on the stream.
constexpr size_t kMaxEarlyBatches = 262144;
constexpr size_t kMaxEarlyBytes = size_t{16} << 20;
// Tries at the lock of a client's mailbox (its owner is not trusted to let go of it).
constexpr int kClientMailboxSpins = 256;
}  // namespace

// The state the session's stream, its runs' callbacks and the mailbox share: they may outlive
// the stream (and then write nothing). gRPC calls are made without holding a lock.
struct ControllerService::Outbox : std::enable_shared_from_this<ControllerService::Outbox> {
  ControllerService* const service;
  explicit Outbox(ControllerService* s) : service(s) {}

  pw::Mutex mu;
  SessionStream* stream ABSL_GUARDED_BY(mu) = nullptr;  // Null once finished.
  BatchQueue<v1::SessionEventBatch> queue ABSL_GUARDED_BY(mu);
  bool reads_over ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  bool paused ABSL_GUARDED_BY(mu) = false;  // Not reading: too many runs in flight.
  absl::Status end ABSL_GUARDED_BY(mu);      // What the stream finishes with.
  int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  int64_t limit ABSL_GUARDED_BY(mu) = 0;
  // Its events unwritten passed ClientLimits::max_unread_event_bytes: later ones are dropped.
  bool unread_over ABSL_GUARDED_BY(mu) = false;
  bool ending ABSL_GUARDED_BY(mu) = false;  // EndReads has begun (once).
  // Reads being started off the stream's reactions (ReadFromOutside): the stream is not
  // finished meanwhile.
  int reads_starting ABSL_GUARDED_BY(mu) = 0;
  // A batch read from the stream waits in `early` for those mailed before it: the stream is not
  // read until it is handled (so at most one waits).
  bool stream_parked ABSL_GUARDED_BY(mu) = false;

  // Set once, before anything is handled (the first batch) or mailed.
  ClientId client;
  uint64_t stub = 0;                                // With mail: the session's.
  std::shared_ptr<dataplane::ShmMailbox> to_client;  // With mail: where events go.
  std::atomic<bool> mail_off{false};  // Its lock was held too long: events on the stream.

  // Batches are handled in number order, by whichever thread has the next one.
  struct Early {
    v1::SessionMessageBatch batch;
    bool mailed;
  };
  pw::Mutex order_mu;
  uint64_t next_number ABSL_GUARDED_BY(order_mu) = 1;
  bool handling ABSL_GUARDED_BY(order_mu) = false;
  std::map<uint64_t, Early> early ABSL_GUARDED_BY(order_mu);
  size_t early_bytes ABSL_GUARDED_BY(order_mu) = 0;

  // The stream to finish, once reads are over and nothing is being written.
  SessionStream* TakeToFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!reads_over || queue.writing() || reads_starting > 0 || stream == nullptr) return nullptr;
    return std::exchange(stream, nullptr);
  }
  void Push(v1::SessionEvent e);
  void WriteDone(bool ok);
  // A run of the session ended: reading resumes if it waited for that.
  void RunEnded();
  // Handles `batch` in its order (now, or once those before it are in). True if it is a batch
  // from the stream left waiting (the stream's reader then stops; reading resumes once it is
  // handled).
  bool Take(v1::SessionMessageBatch batch, bool mailed);
  // The client went away, closed its session or broke the protocol (`why`): release
  // everything it held, then finish with `why` once the replies queued meanwhile are written.
  void EndReads(const absl::Status& why = absl::OkStatus());

 private:
  // Mails `e` to the client (false if it did not fit).
  bool Mail(const v1::SessionEvent& e);
  // Starts the stream's next read from a thread that is not one of its reactions (counted in
  // reads_starting; the stream is finished after, if that became due meanwhile).
  void ReadFromOutside(SessionStream* s);
  // A batch from the stream that waited has been handled: reading resumes unless paused.
  void ResumeReading();
  void Handle(const v1::SessionMessageBatch& batch, bool mailed);
  void Handle(const v1::SessionMessage& m);
  void Submit(const v1::SubmitRequest& req);
  // The submit `seq` was refused.
  void Failed(uint64_t seq, const absl::Status& s);
};

// Reads one batch of messages at a time and hands it to the outbox to handle, in order, before
// reading the next; pauses while the session has its limit of runs in flight. Replies are
// written from the outbox's queue, those queued during a write together in the next
// (BatchQueue).
class ControllerService::SessionStream final
    : public grpc::ServerBidiReactor<v1::SessionMessageBatch, v1::SessionEventBatch> {
 public:
  SessionStream(ControllerService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx), out_(std::make_shared<Outbox>(service)) {
    {
      pw::MutexLock lock(&out_->mu);
      out_->stream = this;
      out_->limit = service->limits_.max_runs_in_flight;
    }
    StartRead(&msgs_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return out_->EndReads();
    if (!out_->client.valid() && msgs_.items_size() > 0) {  // The first message names the client.
      absl::Status s = service_->OpenSession(ctx_, msgs_.items(0).client());
      if (!s.ok()) {
        {
          pw::MutexLock lock(&out_->mu);
          out_->stream = nullptr;  // Nothing written yet: finish now.
          out_->reads_over = true;
        }
        return Finish(ToGrpc(s));
      }
      out_->client = ClientId(msgs_.items(0).client());
      TakeMail();
    }
    // The back-pressure below is checked between batches: a batch larger than a client
    // sends (BatchQueue::kMaxItems) would pass it by.
    if (msgs_.items_size() > kMaxBatchItems) {
      return out_->EndReads(absl::InvalidArgumentError(
          absl::StrCat("Session: a batch of ", msgs_.items_size(), " messages (at most ",
                       kMaxBatchItems, ")")));
    }
    const bool parked = out_->Take(std::move(msgs_), /*mailed=*/false);
    msgs_.Clear();
    if (parked) return;  // Whoever handles it resumes reading.
    bool read = false, end = false;
    {
      pw::MutexLock lock(&out_->mu);
      out_->paused = out_->in_flight >= out_->limit;
      read = !out_->paused && !out_->reads_over;
      end = out_->paused && out_->cancelled;  // OnCancel ran meanwhile, saw no pause.
    }
    if (end) return out_->EndReads();
    if (read) StartRead(&msgs_);
  }

  void OnWriteDone(bool ok) override { out_->WriteDone(ok); }

  void OnCancel() override {
    bool end = false;
    {
      pw::MutexLock lock(&out_->mu);
      out_->cancelled = true;
      end = out_->paused || out_->stream_parked;  // No read is outstanding to end with the call.
    }
    if (end) out_->EndReads();
  }

  void OnDone() override {
    service_->ForgetMail(out_->stub);
    delete this;
  }

  void Read() { StartRead(&msgs_); }

 private:
  // A client on this machine that named its mailbox gets mail both ways if the mailbox opens
  // here: said in the initial metadata, with the limit of runs in flight it must keep to.
  void TakeMail() {
    if (service_->mailbox_.empty()) return;
    const std::string stub = Metadata(ctx_, kMailStub);
    const std::string mailbox = Metadata(ctx_, kReplyMailbox);
    uint64_t id = 0, key = 0;
    // Not the controller's own mailbox (events there would crowd out its workers').
    if (mailbox.empty() || mailbox == service_->mailbox_ || !absl::SimpleAtoi(stub, &id) ||
        id == 0 || !absl::SimpleAtoi(Metadata(ctx_, kMailKey), &key))
      return;
    absl::StatusOr<std::unique_ptr<dataplane::ShmMailbox>> to = dataplane::ShmMailbox::Open(mailbox);
    // Not on this machine, or not the client's: a mailbox whose key it does not know (a worker's,
    // another client's, another user's) gets none of its events. The stream it is.
    if (!to.ok() || (*to)->key() != key) return;
    out_->stub = id;
    out_->to_client = *std::move(to);
    int64_t limit = 0;
    {
      pw::MutexLock lock(&out_->mu);
      limit = out_->limit;
    }
    {
      pw::MutexLock lock(&service_->mail_mu_);
      if (!service_->mail_sessions_.try_emplace(id, out_).second) {  // A stub in use: no mail.
        out_->stub = 0;
        out_->to_client.reset();
        return;
      }
    }
    ctx_->AddInitialMetadata(kMailOk, service_->mailbox_);
    ctx_->AddInitialMetadata(kMailLimit, absl::StrCat(limit));
    StartSendInitialMetadata();
  }

  ControllerService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const std::shared_ptr<Outbox> out_;
  v1::SessionMessageBatch msgs_;
};

void ControllerService::Outbox::Push(v1::SessionEvent e) {
  SessionStream* s = nullptr;
  v1::SessionEventBatch* first = nullptr;
  {
    pw::MutexLock lock(&mu);
    if (stream == nullptr || unread_over) return;
  }
  if (to_client != nullptr && !mail_off.load(std::memory_order_relaxed) && Mail(e)) return;
  size_t unread = 0;
  {
    pw::MutexLock lock(&mu);
    if (stream == nullptr || unread_over) return;
    queue.Push(std::move(e));
    if (queue.bytes() > static_cast<size_t>(service->limits_.max_unread_event_bytes)) {
      // A client that does not read: what it held goes, and so does what waits for it (the
      // batch being written stays until it reads or goes; then the stream finishes).
      unread_over = true;
      unread = queue.bytes();
      queue.DropWaiting();
    } else if ((first = queue.StartNext()) == nullptr) {
      return;
    }
    s = stream;
  }
  if (unread > 0) {
    return EndReads(absl::ResourceExhaustedError(absl::StrCat(
        "Session of ", client.ToString(), ": its client left ", unread,
        " bytes of events unread, more than the controller holds for it (",
        service->limits_.max_unread_event_bytes, "); it does not read its stream")));
  }
  s->StartWrite(first);
}

bool ControllerService::Outbox::Mail(const v1::SessionEvent& e) {
  v1::PeerMail m;
  m.mutable_session_events()->set_stub(stub);
  *m.mutable_session_events()->mutable_batch()->add_items() = e;
  const absl::Status sent = SendMail(*to_client, m, kClientMailboxSpins);
  if (!sent.ok() && absl::StrContains(sent.message(), "lock"))
    mail_off.store(true, std::memory_order_relaxed);
  return sent.ok();
}

void ControllerService::Outbox::WriteDone(bool ok) {
  SessionStream* s = nullptr;
  v1::SessionEventBatch* next = nullptr;
  SessionStream* finish = nullptr;
  bool more = false;
  absl::Status why;
  {
    pw::MutexLock lock(&mu);
    why = end;
    queue.WriteDone();
    if (!ok) queue.DropWaiting();  // The client is gone; the read side ends too.
    if ((next = queue.StartNext()) != nullptr) {
      s = stream;
      more = queue.more();
    }
    finish = TakeToFinishLocked();
  }
  if (next != nullptr) s->StartWrite(next, Coalesced(more));
  if (finish != nullptr) finish->Finish(ToGrpc(why));
}

void ControllerService::Outbox::RunEnded() {
  SessionStream* s = nullptr;
  {
    pw::MutexLock lock(&mu);
    --in_flight;
    if (!paused || in_flight >= limit || cancelled || reads_over || ending || stream == nullptr)
      return;
    paused = false;
    if (stream_parked) return;  // Reading resumes once that batch is handled.
    s = stream;
    ++reads_starting;
  }
  ReadFromOutside(s);
}

void ControllerService::Outbox::ResumeReading() {
  SessionStream* s = nullptr;
  {
    pw::MutexLock lock(&mu);
    stream_parked = false;
    paused = in_flight >= limit;
    if (paused || cancelled || reads_over || ending || stream == nullptr) return;
    s = stream;
    ++reads_starting;
  }
  ReadFromOutside(s);
}

void ControllerService::Outbox::ReadFromOutside(SessionStream* s) {
  s->Read();
  SessionStream* finish = nullptr;
  absl::Status why;
  {
    pw::MutexLock lock(&mu);
    --reads_starting;
    finish = TakeToFinishLocked();
    why = end;
  }
  if (finish != nullptr) finish->Finish(ToGrpc(why));
}

bool ControllerService::Outbox::Take(v1::SessionMessageBatch batch, bool mailed) {
  absl::Status bad;
  {
    pw::MutexLock lock(&order_mu);
    const uint64_t n = batch.number() == 0 && !mailed ? next_number : batch.number();
    if (n == 0) {
      bad = absl::InvalidArgumentError("Session: a mailed batch without a number");
    } else if (n < next_number || (n == next_number && handling) || early.contains(n)) {
      bad = absl::InvalidArgumentError(absl::StrCat("Session: batch ", n, " came twice"));
    } else if (handling || n != next_number) {
      const size_t bytes = batch.ByteSizeLong();
      if (!mailed && stub == 0) {  // Without mail nothing can come between.
        bad = absl::InvalidArgumentError(
            absl::StrCat("Session: batch ", n, " came before batch ", next_number));
      } else if (early.size() >= kMaxEarlyBatches || early_bytes + bytes > kMaxEarlyBytes) {
        bad = absl::InvalidArgumentError(absl::StrCat(
            "Session: more than ", kMaxEarlyBatches, " batches or ", kMaxEarlyBytes,
            " bytes wait for batch ", next_number));
      } else {
        if (!mailed) {
          pw::MutexLock out_lock(&mu);  // Before another thread can take it from `early`.
          stream_parked = true;
        }
        early_bytes += bytes;
        early.emplace(n, Early{std::move(batch), mailed});
        return !mailed;
      }
    } else {
      handling = true;
    }
  }
  if (!bad.ok()) {
    EndReads(bad);
    return false;
  }
  for (bool waited = false;; waited = true) {
    Handle(batch, mailed);
    if (waited && !mailed) ResumeReading();
    pw::MutexLock lock(&order_mu);
    ++next_number;
    auto it = early.find(next_number);
    if (it == early.end()) {
      handling = false;
      return false;
    }
    early_bytes -= it->second.batch.ByteSizeLong();
    batch = std::move(it->second.batch);
    mailed = it->second.mailed;
    early.erase(it);
  }
}

void ControllerService::Outbox::Handle(const v1::SessionMessageBatch& batch, bool mailed) {
  absl::Status over;
  {
    pw::MutexLock lock(&mu);
    if (reads_over) return;  // Ended meanwhile: what it held is released already.
    if (mailed) {
      // A client that mails keeps within its limit, counting the runs it has not seen end.
      int64_t submits = 0;
      for (const v1::SessionMessage& m : batch.items()) submits += m.has_submit() ? 1 : 0;
      if (in_flight + submits > limit)
        over = absl::ResourceExhaustedError(absl::StrCat(
            "Session: ", client.ToString(), " mailed ", submits, " runs with ", in_flight,
            " in flight (at most ", limit, ")"));
    }
  }
  if (!over.ok()) return EndReads(over);
  for (const v1::SessionMessage& m : batch.items()) Handle(m);
}

void ControllerService::Outbox::Handle(const v1::SessionMessage& m) {
  switch (m.call_case()) {
    case v1::SessionMessage::kSubmit:
      Submit(m.submit());
      break;
    case v1::SessionMessage::kRelease:
      // Errors (a handle it does not hold) have no one to go to: the client was told OK.
      for (int64_t b : m.release().buffers())
        service->controller_->ReleaseArray(client, BufferId(b)).IgnoreError();
      break;
    case v1::SessionMessage::CALL_NOT_SET:
      break;  // The first message, or one from a newer client: nothing to do.
  }
}

void ControllerService::Outbox::Submit(const v1::SubmitRequest& req) {
  const uint64_t seq = req.seq();
  absl::StatusOr<RunOptions> options = RunOptionsFromProto(req);
  if (!options.ok()) return Failed(seq, options.status());
  std::vector<BufferId> args;
  args.reserve(req.args_size());
  for (int64_t a : req.args()) args.push_back(BufferId(a));
  {
    pw::MutexLock lock(&mu);
    ++in_flight;
  }
  // Each run's end is counted before its event goes, so a client that saw it end and mails
  // another run is within the limit here.
  std::shared_ptr<Outbox> self = shared_from_this();
  service->controller_->Submit(client, ProgramId(req.program()), args, *options)
      .OnReady([out = self, seq](const absl::StatusOr<RunInfo>& info) {
        if (!info.ok()) {
          out->RunEnded();
          return out->Failed(seq, info.status());
        }
        v1::SessionEvent e;
        e.set_seq(seq);
        v1::RunInfo* accepted = e.mutable_accepted();
        accepted->set_run(info->run.value());
        for (const ArrayInfo& a : info->outputs) ToProto(a, accepted->add_outputs());
        out->Push(std::move(e));  // Before `done`, which may be ready already.
        info->done.OnReady([out, seq](const absl::Status& s) {
          v1::SessionEvent d;
          d.set_seq(seq);
          ToProto(s, d.mutable_done());
          out->RunEnded();
          out->Push(std::move(d));
        });
      });
}

void ControllerService::Outbox::Failed(uint64_t seq, const absl::Status& s) {
  v1::SessionEvent e;
  e.set_seq(seq);
  ToProto(s, e.mutable_failed());
  Push(std::move(e));
}

void ControllerService::Outbox::EndReads(const absl::Status& why) {
  {
    pw::MutexLock lock(&mu);
    if (reads_over || ending) return;
    ending = true;
    end = why;
  }
  if (client.valid()) (void)service->DropClient(client);
  SessionStream* finish = nullptr;
  {
    pw::MutexLock lock(&mu);
    reads_over = true;
    finish = TakeToFinishLocked();
  }
  if (finish != nullptr) finish->Finish(ToGrpc(why));
}

grpc::ServerBidiReactor<v1::SessionMessageBatch, v1::SessionEventBatch>*
ControllerService::Session(grpc::CallbackServerContext* ctx) {
  return new SessionStream(this, ctx);
}

void ControllerService::UseMailbox(std::string own_mailbox) { mailbox_ = std::move(own_mailbox); }

void ControllerService::ReceiveSessionMail(v1::MailedSession* mail) {
  std::shared_ptr<Outbox> out;
  {
    pw::MutexLock lock(&mail_mu_);
    auto it = mail_sessions_.find(mail->stub());
    if (it == mail_sessions_.end()) return;
    out = it->second;
  }
  if (mail->batch().items_size() > kMaxBatchItems) {
    return out->EndReads(absl::InvalidArgumentError(
        absl::StrCat("Session: a mailed batch of ", mail->batch().items_size(),
                     " messages (at most ", kMaxBatchItems, ")")));
  }
  session_batches_mailed_.fetch_add(1, std::memory_order_relaxed);
  // Off the mailbox's thread, which brings the workers' events too: a run's submit may wait
  // (a function loaded on a host first). A session's batches keep to one queue.
  WorkQueue* queue = session_mail_[mail->stub() % session_mail_.size()].get();
  if (queue == nullptr) return;  // Stopped.
  queue->Post(
      [out = std::move(out), batch = std::move(*mail->mutable_batch())]() mutable {
        out->Take(std::move(batch), /*mailed=*/true);
      });
}

void ControllerService::StopSessionMail() {
  for (auto& q : session_mail_) q.reset();  // Runs what was posted, then joins.
}

void ControllerService::ForgetMail(uint64_t stub) {
  if (stub == 0) return;
  pw::MutexLock lock(&mail_mu_);
  mail_sessions_.erase(stub);
}

}  // namespace pw::rpc
