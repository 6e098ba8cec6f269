// The controller's side of a client's Session stream: the client's runs and releases, in order,
// and the runs' acceptance and ends back.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pw/rpc/batch_queue.h"
#include "pw/rpc/controller_service.h"
#include "pw/rpc/reactors.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {
namespace v1 = ::pathways::v1;

// Reads one batch of messages at a time and handles them, in order, before reading the next (so
// the client's calls keep their order); replies are written from a queue, those queued during a
// write together in the next (BatchQueue). The state the client's
// runs report to lives in `Outbox`, which the runs' callbacks share: they may fire after the
// stream has finished, and then write nothing. gRPC calls are made without holding the lock.
class ControllerService::SessionStream final
    : public grpc::ServerBidiReactor<v1::SessionMessageBatch, v1::SessionEventBatch> {
 public:
  SessionStream(ControllerService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx), out_(std::make_shared<Outbox>()) {
    {
      pw::MutexLock lock(&out_->mu);
      out_->stream = this;
      out_->limit = service->limits_.max_runs_in_flight;
    }
    StartRead(&msgs_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return EndReads();
    if (!client_.valid() && msgs_.items_size() > 0) {  // The first message names the client.
      absl::Status s = service_->OpenSession(ctx_, msgs_.items(0).client());
      if (!s.ok()) {
        {
          pw::MutexLock lock(&out_->mu);
          out_->stream = nullptr;  // Nothing written yet: finish now.
          out_->reads_over = true;
        }
        return Finish(ToGrpc(s));
      }
      client_ = ClientId(msgs_.items(0).client());
    }
    // The back-pressure below is checked between batches: a batch larger than a client
    // sends (BatchQueue::kMaxItems) would pass it by.
    if (msgs_.items_size() > kMaxBatchItems) {
      return EndReads(absl::InvalidArgumentError(
          absl::StrCat("Session: a batch of ", msgs_.items_size(), " messages (at most ",
                       kMaxBatchItems, ")")));
    }
    for (const v1::SessionMessage& m : msgs_.items()) Handle(m);
    msgs_.Clear();
    bool read = false, end = false;
    {
      pw::MutexLock lock(&out_->mu);
      out_->paused = out_->in_flight >= out_->limit;
      read = !out_->paused;
      end = out_->paused && out_->cancelled;  // OnCancel ran meanwhile, saw no pause.
    }
    if (end) return EndReads();
    if (read) StartRead(&msgs_);
  }

  void OnWriteDone(bool ok) override { out_->WriteDone(ok); }

  void OnCancel() override {
    bool end = false;
    {
      pw::MutexLock lock(&out_->mu);
      out_->cancelled = true;
      end = out_->paused;  // No read is outstanding to end with the call.
    }
    if (end) EndReads();
  }

  void OnDone() override { delete this; }

 private:
  struct Outbox {
    pw::Mutex mu;
    SessionStream* stream ABSL_GUARDED_BY(mu) = nullptr;  // Null once finished.
    BatchQueue<v1::SessionEventBatch> queue ABSL_GUARDED_BY(mu);
    bool reads_over ABSL_GUARDED_BY(mu) = false;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    bool paused ABSL_GUARDED_BY(mu) = false;  // Not reading: too many runs in flight.
    absl::Status end ABSL_GUARDED_BY(mu);      // What the stream finishes with.
    int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
    int64_t limit ABSL_GUARDED_BY(mu) = 0;

    // The stream to finish, once reads are over and nothing is being written.
    SessionStream* TakeToFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (!reads_over || queue.writing() || stream == nullptr) return nullptr;
      return std::exchange(stream, nullptr);
    }
    void Push(v1::SessionEvent e) {
      SessionStream* s = nullptr;
      v1::SessionEventBatch* first = nullptr;
      {
        pw::MutexLock lock(&mu);
        if (stream == nullptr) return;
        queue.Push(std::move(e));
        if ((first = queue.StartNext()) == nullptr) return;
        s = stream;
      }
      s->StartWrite(first);
    }
    void WriteDone(bool ok) {
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
    // A run of the session ended: reading resumes if it waited for that.
    void RunEnded() {
      SessionStream* s = nullptr;
      {
        pw::MutexLock lock(&mu);
        --in_flight;
        if (!paused || in_flight >= limit || cancelled || reads_over || stream == nullptr) return;
        paused = false;
        s = stream;
      }
      s->StartRead(&s->msgs_);
    }
  };

  // One message of the client's, in the order it sent them.
  void Handle(const v1::SessionMessage& m) {
    switch (m.call_case()) {
      case v1::SessionMessage::kSubmit:
        Submit(m.submit());
        break;
      case v1::SessionMessage::kRelease:
        // Errors (a handle it does not hold) have no one to go to: the client was told OK.
        for (int64_t b : m.release().buffers())
          service_->controller_->ReleaseArray(client_, BufferId(b)).IgnoreError();
        break;
      case v1::SessionMessage::CALL_NOT_SET:
        break;  // The first message, or one from a newer client: nothing to do.
    }
  }

  void Submit(const v1::SubmitRequest& req) {
    const uint64_t seq = req.seq();
    absl::StatusOr<RunOptions> options = RunOptionsFromProto(req);
    if (!options.ok()) return Failed(*out_, seq, options.status());
    std::vector<BufferId> args;
    args.reserve(req.args_size());
    for (int64_t a : req.args()) args.push_back(BufferId(a));
    {
      pw::MutexLock lock(&out_->mu);
      ++out_->in_flight;
    }
    service_->controller_->Submit(client_, ProgramId(req.program()), args, *options)
        .OnReady([out = out_, seq](const absl::StatusOr<RunInfo>& info) {
          if (!info.ok()) {
            Failed(*out, seq, info.status());
            return out->RunEnded();
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
            out->Push(std::move(d));
            out->RunEnded();
          });
        });
  }

  // The submit `seq` was refused.
  static void Failed(Outbox& out, uint64_t seq, const absl::Status& s) {
    v1::SessionEvent e;
    e.set_seq(seq);
    ToProto(s, e.mutable_failed());
    out.Push(std::move(e));
  }

  // The client went away, closed its session or broke the protocol (`why`): release
  // everything it held, then finish with `why` once the replies queued meanwhile are written.
  void EndReads(const absl::Status& why = absl::OkStatus()) {
    {
      pw::MutexLock lock(&out_->mu);
      if (out_->reads_over) return;
      out_->end = why;
    }
    if (client_.valid()) (void)service_->DropClient(client_);
    SessionStream* finish = nullptr;
    {
      pw::MutexLock lock(&out_->mu);
      out_->reads_over = true;
      finish = out_->TakeToFinishLocked();
    }
    if (finish != nullptr) finish->Finish(ToGrpc(why));
  }

  static constexpr int kMaxBatchItems = BatchQueue<v1::SessionMessageBatch>::kMaxItems;
  ControllerService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const std::shared_ptr<Outbox> out_;
  v1::SessionMessageBatch msgs_;
  ClientId client_;  // Once the first message is in.
};

grpc::ServerBidiReactor<v1::SessionMessageBatch, v1::SessionEventBatch>*
ControllerService::Session(grpc::CallbackServerContext* ctx) {
  return new SessionStream(this, ctx);
}

}  // namespace pw::rpc
