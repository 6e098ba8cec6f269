#include "pw/rpc/client_session.h"

#include <atomic>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "pw/base/mutex.h"
#include "pw/base/status_macros.h"
#include "pw/rpc/batch_queue.h"
#include "pw/rpc/mail.h"
#include "pw/rpc/reactors.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {
namespace v1 = ::pathways::v1;

// What the owner and the stream share. The stream deletes itself when gRPC is done with it
// (OnDone); it cannot be done while a write-side call is in flight or before the read side has
// ended (a hold), so `stream` may be used by whoever has just set `writing`.
struct ClientSession::State {
  struct Pending {
    Promise<RunInfo> accepted;
    Promise<> done;
    bool answered = false;  // `accepted` is set.
    // Its end, come by the other way before its acceptance (mail).
    std::optional<absl::Status> early_end;
  };
  using Send = std::function<bool(const v1::PeerMail&)>;
  std::string where;
  std::optional<Mail> mail;  // As given; set before the stream opens.
  uint64_t stub = 0;         // NewMailId() with mail.
  absl::Notification finished;  // OnDone has run.
  pw::Mutex mu;
  Stream* stream ABSL_GUARDED_BY(mu) = nullptr;
  BatchQueue<v1::SessionMessageBatch> queue ABSL_GUARDED_BY(mu);
  bool writing ABSL_GUARDED_BY(mu) = false;       // A write-side call is in flight.
  bool closing ABSL_GUARDED_BY(mu) = false;       // Close() was called: end writes.
  bool writes_ended ABSL_GUARDED_BY(mu) = false;  // StartWritesDone was called.
  bool reads_over ABSL_GUARDED_BY(mu) = false;    // The controller ended the stream.
  bool released ABSL_GUARDED_BY(mu) = false;      // The hold is gone.
  int busy ABSL_GUARDED_BY(mu) = 0;               // Others using `stream`: it must stay.
  absl::Status over ABSL_GUARDED_BY(mu);          // Not OK once the stream is done.
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  absl::flat_hash_map<uint64_t, Pending> pending ABSL_GUARDED_BY(mu);
  uint64_t next_number ABSL_GUARDED_BY(mu) = 1;  // The next batch's (SessionMessageBatch).
  // Once the controller takes mail: the sender to its mailbox, and its limit of runs in flight.
  std::shared_ptr<const Send> send ABSL_GUARDED_BY(mu);
  size_t limit ABSL_GUARDED_BY(mu) = 0;
  std::atomic<int64_t> mailed{0};

  // Whether the hold may go now (read side over, nothing in flight); true once.
  bool ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!reads_over || writing || busy > 0 || released) return false;
    released = true;
    return true;
  }
  // Starts the next write-side call if none is in flight; mails what may go by mail.
  void Kick();
  // Mails `batch` (false if it did not fit: it is left as it was).
  bool MailBatch(const Send& send, v1::SessionMessageBatch* batch);
  // One event of the controller's, by either way.
  void Handle(const v1::SessionEvent& e);
  // Ends a use of `s` begun with ++busy.
  void Unbusy(Stream* s);
};

class ClientSession::Stream final
    : public grpc::ClientBidiReactor<v1::SessionMessageBatch, v1::SessionEventBatch> {
 public:
  Stream(std::shared_ptr<State> state, v1::Controller::Stub* stub,
         const std::function<void(grpc::ClientContext*)>& prepare)
      : state_(std::move(state)) {
    prepare(&ctx_);
    if (state_->mail.has_value()) {
      ctx_.AddMetadata(kMailStub, absl::StrCat(state_->stub));
      ctx_.AddMetadata(kReplyMailbox, state_->mail->self_mailbox);
      ctx_.AddMetadata(kMailKey, absl::StrCat(state_->mail->self_key));
    }
    stub->async()->Session(&ctx_, this);
    AddHold();
    StartRead(&events_);
    StartCall();
  }
  void Cancel() { ctx_.TryCancel(); }

  // The controller says whether it takes mail: its mailbox's name and its limit of runs in
  // flight.
  void OnReadInitialMetadataDone(bool ok) override {
    if (!ok || !state_->mail.has_value()) return;
    const auto& md = ctx_.GetServerInitialMetadata();
    auto name = md.find(kMailOk);
    auto limit = md.find(kMailLimit);
    size_t runs = 0;
    if (name == md.end() || limit == md.end() ||
        !absl::SimpleAtoi(absl::string_view(limit->second.data(), limit->second.size()), &runs))
      return;
    absl::StatusOr<State::Send> send =
        state_->mail->open(std::string(name->second.data(), name->second.size()));
    if (!send.ok()) return;  // Then the stream carries it all.
    {
      pw::MutexLock lock(&state_->mu);
      state_->send = std::make_shared<const State::Send>(*std::move(send));
      state_->limit = runs;
    }
    state_->Kick();
  }

  void OnWriteDone(bool ok) override {
    bool release = false;
    {
      pw::MutexLock lock(&state_->mu);
      state_->queue.WriteDone();
      if (!ok) state_->queue.DropWaiting();  // Broken; OnDone reports why.
      state_->writing = false;
      release = state_->ReleaseLocked();
    }
    if (release) return RemoveHold();
    state_->Kick();
  }
  void OnWritesDoneDone(bool) override {
    bool release = false;
    {
      pw::MutexLock lock(&state_->mu);
      state_->writing = false;
      release = state_->ReleaseLocked();
    }
    if (release) RemoveHold();
  }
  void OnReadDone(bool ok) override {
    if (ok) {
      for (const v1::SessionEvent& e : events_.items()) state_->Handle(e);
      events_.Clear();
      StartRead(&events_);
      return;
    }
    bool release = false;
    {
      pw::MutexLock lock(&state_->mu);
      state_->reads_over = true;
      // Drop what waits, but not the batch being written: gRPC still reads it.
      state_->queue.DropWaiting();
      release = state_->ReleaseLocked();
    }
    if (release) RemoveHold();
  }
  void OnDone(const grpc::Status& s) override {
    // Ends mailed before the stream ended are taken first.
    if (state_->mail.has_value() && state_->mail->drain) state_->mail->drain();
    absl::Status why = FromGrpc(s);
    why = why.ok() ? absl::UnavailableError(
                         absl::StrCat("the controller at ", state_->where, " ended the session"))
                   : Annotate(why, absl::StrCat("session with the controller at ", state_->where));
    absl::flat_hash_map<uint64_t, State::Pending> pending;
    {
      pw::MutexLock lock(&state_->mu);
      state_->over = why;
      state_->stream = nullptr;
      pending.swap(state_->pending);
    }
    for (auto& [seq, p] : pending) {
      if (!p.answered) p.accepted.Set(why);
      p.done.Set(why);
    }
    std::shared_ptr<State> state = state_;
    delete this;
    state->finished.Notify();
  }

 private:
  const std::shared_ptr<State> state_;
  grpc::ClientContext ctx_;
  v1::SessionEventBatch events_;
};

void ClientSession::State::Handle(const v1::SessionEvent& e) {
  std::optional<Promise<RunInfo>> accepted;
  std::optional<Promise<>> done;
  absl::StatusOr<RunInfo> info = RunInfo{};
  absl::Status end;
  {
    pw::MutexLock lock(&mu);
    auto it = pending.find(e.seq());
    if (it == pending.end()) return;  // Not ours (a newer controller's extra event).
    State::Pending& p = it->second;
    switch (e.event_case()) {
      case v1::SessionEvent::kAccepted: {
        if (p.answered) return;
        info->run = RunId(e.accepted().run());
        for (const auto& o : e.accepted().outputs()) {
          absl::StatusOr<ArrayInfo> a = FromProto(o);
          if (!a.ok()) {
            info = Annotate(a.status(), "a run's acceptance");
            break;
          }
          info->outputs.push_back(*std::move(a));
        }
        p.answered = true;
        accepted = std::move(p.accepted);
        if (info.ok()) {
          info->done = p.done.future();
          if (!p.early_end.has_value()) break;
          end = *p.early_end;  // Its end came first (by the other way).
          done = std::move(p.done);
          pending.erase(it);
          break;
        }
        end = info.status();  // Unreadable: the run counts as failed here.
        done = std::move(p.done);
        pending.erase(it);
        break;
      }
      case v1::SessionEvent::kFailed:
      case v1::SessionEvent::kDone: {
        end = FromProto(e.has_failed() ? e.failed() : e.done());
        if (!p.answered && e.has_done() && mail.has_value()) {
          // Mailed, it may pass its acceptance written on the stream (or the other way round).
          p.early_end = end;
          return;
        }
        if (!p.answered) {
          accepted = std::move(p.accepted);
          info = end.ok() ? absl::InternalError("a run ended before it was accepted") : end;
        }
        done = std::move(p.done);
        pending.erase(it);
        break;
      }
      case v1::SessionEvent::EVENT_NOT_SET:
        return;
    }
  }
  if (accepted.has_value()) accepted->Set(std::move(info));
  if (done.has_value()) done->Set(end);
}

void ClientSession::State::Kick() {
  while (true) {
    Stream* s = nullptr;
    v1::SessionMessageBatch* next = nullptr;
    bool more = false;
    std::shared_ptr<const Send> by_mail;
    {
      pw::MutexLock lock(&mu);
      if (writing || reads_over || stream == nullptr) return;
      if ((next = queue.StartNext()) != nullptr) {
        more = queue.more();
        next->set_number(next_number++);
        // Fewer runs not seen ended than the limit (counting the runs still queued): the
        // controller, which counts a run until its end goes, has not paused reading for them.
        if (send != nullptr && pending.size() < limit) by_mail = send;
      } else if (!closing || writes_ended) {
        return;
      }
      writing = true;
      writes_ended = writes_ended || next == nullptr;
      s = stream;
    }
    if (next == nullptr) return s->StartWritesDone();
    if (by_mail == nullptr || !MailBatch(*by_mail, next)) return s->StartWrite(next, Coalesced(more));
    mailed.fetch_add(1, std::memory_order_relaxed);
    bool release = false;
    {
      pw::MutexLock lock(&mu);
      queue.WriteDone();
      writing = false;
      release = ReleaseLocked();
    }
    if (release) return s->RemoveHold();
  }
}

bool ClientSession::State::MailBatch(const Send& send, v1::SessionMessageBatch* batch) {
  v1::PeerMail m;
  m.mutable_session()->set_stub(stub);
  m.mutable_session()->mutable_batch()->Swap(batch);
  if (send(m)) return true;
  batch->Swap(m.mutable_session()->mutable_batch());
  return false;
}

void ClientSession::State::Unbusy(Stream* s) {
  bool release = false;
  {
    pw::MutexLock lock(&mu);
    --busy;
    release = ReleaseLocked();
  }
  if (release) s->RemoveHold();
}

ClientSession::ClientSession(v1::Controller::Stub* stub, ClientId client,
                             const std::function<void(grpc::ClientContext*)>& prepare,
                             std::string where, std::optional<Mail> mail)
    : state_(std::make_shared<State>()) {
  state_->where = std::move(where);
  if (mail.has_value()) {
    state_->mail = std::move(mail);
    state_->stub = NewMailId();
  }
  v1::SessionMessage hello;
  hello.set_client(client.value());
  {
    pw::MutexLock lock(&state_->mu);
    state_->queue.Push(std::move(hello));
    ++state_->busy;  // Until `stream` is set.
  }
  Stream* s = new Stream(state_, stub, prepare);  // Its reactions may run at once.
  {
    pw::MutexLock lock(&state_->mu);
    state_->stream = s;
  }
  state_->Unbusy(s);
  state_->Kick();
}

ClientSession::~ClientSession() { Close(); }

Future<RunInfo> ClientSession::Submit(v1::SubmitRequest req) {
  Future<RunInfo> accepted;
  {
    pw::MutexLock lock(&state_->mu);
    if (!state_->over.ok()) return Future<RunInfo>::Ready(state_->over);
    if (state_->closing)
      return Future<RunInfo>::Ready(absl::FailedPreconditionError("the session is closed"));
    const uint64_t seq = state_->next_seq++;
    req.set_seq(seq);
    accepted = state_->pending[seq].accepted.future();
    v1::SessionMessage m;
    *m.mutable_submit() = std::move(req);
    state_->queue.Push(std::move(m));
  }
  state_->Kick();
  return accepted;
}

void ClientSession::Release(BufferId id) {
  {
    pw::MutexLock lock(&state_->mu);
    if (!state_->over.ok() || state_->closing) return;  // The controller releases it all.
    // Onto the last queued release unless that one is being written or full.
    constexpr int kMaxReleasesPerMessage = 8192;
    if (v1::SessionMessage* last = state_->queue.LastWaiting();
        last && last->has_release() && last->release().buffers_size() < kMaxReleasesPerMessage) {
      last->mutable_release()->add_buffers(id.value());
      state_->queue.Grew(10);  // At most: an id's varint.
      return;
    }
    v1::SessionMessage m;
    m.mutable_release()->add_buffers(id.value());
    state_->queue.Push(std::move(m));
  }
  state_->Kick();
}

uint64_t ClientSession::mail_stub() const { return state_->stub; }

void ClientSession::OnMailedEvents(const v1::SessionEventBatch& events) {
  for (const v1::SessionEvent& e : events.items()) state_->Handle(e);
}

int64_t ClientSession::batches_mailed() const {
  return state_->mailed.load(std::memory_order_relaxed);
}

void ClientSession::Close(absl::Duration grace) {
  {
    pw::MutexLock lock(&state_->mu);
    state_->closing = true;
  }
  state_->Kick();
  if (state_->finished.WaitForNotificationWithTimeout(grace)) return;
  Stream* s = nullptr;
  {
    pw::MutexLock lock(&state_->mu);
    if ((s = state_->stream) != nullptr) ++state_->busy;
  }
  if (s != nullptr) {
    s->Cancel();  // Done soon after.
    state_->Unbusy(s);
  }
  state_->finished.WaitForNotification();
}

}  // namespace pw::rpc
