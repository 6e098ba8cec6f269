#include "pw/rpc/worker_service.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "pw/base/heap.h"
#include "pw/base/status_macros.h"
#include "pw/dataplane/peer_channel.h"
#include "pw/dataplane/shm_segment.h"
#include "pw/rpc/batch_queue.h"
#include "pw/rpc/mail.h"
#include "pw/rpc/reactors.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {
namespace v1 = ::pathways::v1;

WorkerService::WorkerService(WorkerInterface* worker, std::string token,
                             CollectiveReceiver receive_collective, dataplane::BulkServer* bulk,
                             HostsReceiver on_hosts, PutLater put_later, Mailer mail,
                             MailReceiver on_mail)
    : worker_(worker),
      token_(std::move(token)),
      receive_collective_(std::move(receive_collective)),
      bulk_(bulk),
      on_hosts_(std::move(on_hosts)),
      put_later_(std::move(put_later)),
      mail_(std::move(mail)),
      on_mail_(std::move(on_mail)) {}

absl::StatusOr<std::shared_ptr<const HostProgram>> WorkerService::Program(
    uint64_t id, const v1::HostProgram* body) {
  pw::MutexLock lock(&mu_);
  if (body != nullptr) {
    PW_ASSIGN_OR_RETURN(HostProgram p, FromProto(*body));
    p.id = id;
    auto ref = std::make_shared<const HostProgram>(std::move(p));
    programs_[id] = ref;
    return ref;
  }
  auto it = programs_.find(id);
  if (it == programs_.end())
    return absl::NotFoundError(absl::StrCat("host program ", id, " was never sent to ",
                                            worker_->host().ToString()));
  return it->second;
}

void WorkerService::ForgetPrograms(const std::vector<uint64_t>& ids) {
  pw::MutexLock lock(&mu_);
  for (uint64_t id : ids) programs_.erase(id);
}

grpc::ServerUnaryReactor* WorkerService::LoadFunction(grpc::CallbackServerContext* ctx,
                                                      const v1::WorkerLoadFunctionRequest* req,
                                                      v1::Empty*) {
  if (absl::Status s = CheckClusterToken(ctx, token_); !s.ok()) return Reply(ctx, s);
  absl::StatusOr<FunctionDef> def = FromProto(req->def());
  if (!def.ok()) return Reply(ctx, Annotate(def.status(), "LoadFunction"));
  if (req->function() < 0) return Reply(ctx, absl::InvalidArgumentError("LoadFunction: negative function id"));
  return ReplyWhen(ctx, worker_->LoadFunction(FunctionId(req->function()), *def));
}

// ---------------------------------------------------------------- the command stream

// Commands come in batches, applied in order. Events are written from a queue, those queued
// during a write together in the next (BatchQueue); futures' callbacks reach the stream through
// `sink`, which outlives the reactor and forgets it once the RPC is done.
struct WorkerService::CommandSink {
  pw::Mutex mu;
  CommandStream* stream ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t mail_stub = 0;  // Set before the sink is shared: the stream takes mail (nonzero).
};

namespace {
// A command stream's metadata asks for its commands by mail as well (MailedCommands, keys in
// mail.h): the stub naming them, the first command's seq, and the mailbox for the events. The
// worker's initial metadata says whether it takes them (kMailOk).
// Commands a mail stream holds behind a missing earlier one, at most (then it ends: the
// controller skipped a seq, or a mail was lost).
constexpr size_t kMaxEarlyCommands = 1 << 16;
}  // namespace

class WorkerService::CommandStream final
    : public grpc::ServerBidiReactor<v1::CommandBatch, v1::CommandEventBatch> {
 public:
  using Sink = CommandSink;

  CommandStream(WorkerService* service, grpc::CallbackServerContext* ctx)
      : service_(service), sink_(std::make_shared<Sink>()) {
    if (absl::Status s = CheckClusterToken(ctx, service->token_); !s.ok()) {
      Finish(ToGrpc(s));
      return;
    }
    std::optional<absl::Status> ended;
    {
      pw::MutexLock lock(&service_->mu_);
      ended = service_->streams_ended_;
      if (!ended.has_value()) service_->command_sinks_.insert(sink_);
    }
    if (ended.has_value()) {
      Finish(ToGrpc(*ended));
      return;
    }
    TakeMail(ctx);
    {
      pw::MutexLock lock(&sink_->mu);
      sink_->stream = this;
    }
    if (sink_->mail_stub != 0) {
      // Registered before the controller hears that it may mail (the initial metadata).
      {
        pw::MutexLock lock(&service_->mu_);
        service_->mail_sinks_[sink_->mail_stub] = sink_;
      }
      ctx->AddInitialMetadata(kMailOk, "1");
      StartSendInitialMetadata();
    }
    StartRead(&commands_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // The controller closed the stream or went away.
      {
        pw::MutexLock lock(&mu_);
        reads_done_ = true;
      }
      MaybeFinish();
      return;
    }
    {
      pw::MutexLock lock(&mu_);
      ++applying_;
    }
    service_->commands_received_.fetch_add(commands_.items_size(), std::memory_order_relaxed);
    service_->command_messages_received_.fetch_add(1, std::memory_order_relaxed);
    if (sink_->mail_stub != 0) {
      ApplyInOrder(commands_.mutable_items());
    } else {
      for (v1::Command& c : *commands_.mutable_items()) Apply(c);
      AnswerFetches();
    }
    commands_.Clear();
    bool ending;
    {
      pw::MutexLock lock(&mu_);
      --applying_;
      ending = ending_;
    }
    if (ending) return MaybeFinish();  // No read after the stream is to end.
    StartRead(&commands_);
  }

  // Ends the stream with `why` (EndStreams): at once, or when its write or the commands being
  // applied are done.
  static void End(const std::shared_ptr<Sink>& sink, const absl::Status& why) {
    CommandStream* stream = nullptr;
    {
      // The stream lives while its sink names it (OnDone clears that first).
      pw::MutexLock lock(&sink->mu);
      if (sink->stream != nullptr && sink->stream->ClaimEnd(why)) stream = sink->stream;
    }
    // Claimed: no other Finish, so no OnDone, until this one.
    if (stream != nullptr) stream->Finish(ToGrpc(why));
  }

  // gRPC calls (Start*, Finish) are made without holding mu_: a reaction may run inline.
  void OnWriteDone(bool ok) override {
    v1::CommandEventBatch* next = nullptr;
    bool more = false;
    {
      pw::MutexLock lock(&mu_);
      events_.WriteDone();
      if (!ok) write_failed_ = true;
      if (!ok || ending_) events_.DropWaiting();
      next = events_.StartNext();
      more = events_.more();
      if (next != nullptr) service_->event_messages_sent_.fetch_add(1, std::memory_order_relaxed);
    }
    if (next != nullptr) StartWrite(next, Coalesced(more));
    MaybeFinish();
  }

  void OnDone() override {
    {
      pw::MutexLock lock(&sink_->mu);
      sink_->stream = nullptr;
    }
    {
      pw::MutexLock lock(&service_->mu_);
      service_->command_sinks_.erase(sink_);
      auto it = service_->mail_sinks_.find(sink_->mail_stub);
      if (it != service_->mail_sinks_.end() && it->second == sink_) service_->mail_sinks_.erase(it);
    }
    delete this;
  }

  // Commands of stream `sink` that came by mail: applied in seq order with those read from the
  // stream, unless the stream is over.
  static void ApplyMailed(const std::shared_ptr<Sink>& sink, v1::MailedCommands& mail) {
    CommandStream* stream = nullptr;
    {
      // While applying_ counts this, the stream does not finish, so it stays alive.
      pw::MutexLock lock(&sink->mu);
      if (sink->stream != nullptr && sink->stream->BeginApplying()) stream = sink->stream;
    }
    if (stream == nullptr) return;
    WorkerService* service = stream->service_;
    service->commands_received_.fetch_add(mail.commands_size(), std::memory_order_relaxed);
    service->command_messages_received_.fetch_add(1, std::memory_order_relaxed);
    stream->ApplyInOrder(mail.mutable_commands());
    stream->EndApplying();  // Touches the stream no more unless it finishes it.
  }

  // Queues an event (from any thread).
  static void Send(const std::shared_ptr<Sink>& sink, uint64_t seq, v1::CommandEvent::Kind kind,
                   const absl::Status& s) {
    v1::CommandEvent e;
    e.set_seq(seq);
    e.set_kind(kind);
    if (!s.ok()) ToProto(s, e.mutable_status());
    Deliver(sink, std::move(e));
  }
  static void Deliver(const std::shared_ptr<Sink>& sink, v1::CommandEvent e) {
    pw::MutexLock lock(&sink->mu);
    if (sink->stream != nullptr) sink->stream->Enqueue(std::move(e));
  }
  static void DeliverAll(const std::shared_ptr<Sink>& sink, std::vector<v1::CommandEvent> es) {
    pw::MutexLock lock(&sink->mu);
    if (sink->stream != nullptr) sink->stream->EnqueueAll(absl::MakeSpan(es));
  }
  // Fetch answers: to the reader's mailbox where it asked for that (`reply_stub` nonzero) and
  // they fit, else on the stream. Under the sink's lock: the stream, so the service, is alive.
  static void AnswerAll(const std::shared_ptr<Sink>& sink, const ReplyTo& reply,
                        std::vector<v1::CommandEvent> es) {
    pw::MutexLock lock(&sink->mu);
    if (sink->stream == nullptr) return;
    WorkerService* service = sink->stream->service_;
    if (reply.stub != 0 && service->mail_ != nullptr && service->mail_(reply, es)) {
      service->CountMailedEvents(static_cast<int64_t>(es.size()));
      return;
    }
    sink->stream->EnqueueAll(absl::MakeSpan(es));
  }
  // The answer to fetch `seq`, given to `done`: shard `b`'s bytes (copied to host memory first
  // where they are not there), too_large, or the error.
  static void MakeShardEvent(uint64_t seq, const absl::StatusOr<DeviceBufferRef>& b,
                             absl::AnyInvocable<void(v1::CommandEvent)> done) {
    v1::CommandEvent e;
    e.set_seq(seq);
    e.set_kind(v1::CommandEvent::DONE);
    if (!b.ok()) {
      ToProto(b.status(), e.mutable_status());
      return done(std::move(e));
    }
    const ArraySpec spec = (*b)->spec();
    const size_t size = static_cast<size_t>(spec.size_bytes());
    if (size > kOneChunkMaxBytes) {
      e.set_too_large(true);
      return done(std::move(e));
    }
    ToProto(spec, e.mutable_shard()->mutable_spec());
    std::string* data = e.mutable_shard()->mutable_data();
    if (const HostDeviceBuffer* host = (*b)->AsHost(); host != nullptr) {
      data->assign(static_cast<const char*>(host->data()), size);
      return done(std::move(e));
    }
    data->resize(size);
    auto event = std::make_shared<v1::CommandEvent>(std::move(e));
    (*b)->CopyToHost(event->mutable_shard()->mutable_data()->data())
        .OnReady([event, b = *b, done = std::move(done)](const absl::Status& s) mutable {
          if (!s.ok()) {
            event->clear_shard();
            ToProto(s, event->mutable_status());
          }
          done(std::move(*event));
        });
  }

 private:
  void Enqueue(v1::CommandEvent e) { EnqueueAll(absl::MakeSpan(&e, 1)); }
  // Events (moved from) that go in one write (unless one is under way: then all go in the
  // next); a mail stream's go to the controller's mailbox where they fit.
  void EnqueueAll(absl::Span<v1::CommandEvent> es) {
    if (sink_->mail_stub != 0 && service_->mail_ != nullptr) {
      std::vector<v1::CommandEvent> mailed(std::make_move_iterator(es.begin()),
                                           std::make_move_iterator(es.end()));
      if (service_->mail_(reply_, mailed)) {
        service_->CountMailedEvents(static_cast<int64_t>(mailed.size()));
        return;
      }
      std::move(mailed.begin(), mailed.end(), es.begin());
    }
    v1::CommandEventBatch* first = nullptr;
    {
      pw::MutexLock lock(&mu_);
      if (write_failed_ || finished_ || ending_) return;
      service_->events_sent_.fetch_add(static_cast<int64_t>(es.size()), std::memory_order_relaxed);
      for (v1::CommandEvent& e : es) events_.Push(std::move(e));
      first = events_.StartNext();
      if (first != nullptr) service_->event_messages_sent_.fetch_add(1, std::memory_order_relaxed);
    }
    if (first != nullptr) StartWrite(first);
  }

  // Answers the fetches that came in one batch of commands: those of one buffer together, in
  // one write, once all are ready (a reader asks for a buffer's shards together, FetchShards;
  // they are made by one computation, so none waits long for the others). A reader on this
  // machine that asked for it gets them in its mailbox (AnswerAll).
  void AnswerFetches() {
    AnswerByBuffer(std::move(fetches_),
                   [sink = sink_](const ReplyTo& reply, std::vector<v1::CommandEvent> events) {
                     AnswerAll(sink, reply, std::move(events));
                   });
    fetches_.clear();
  }

 public:
  // A fetch asked for, and where its answer goes.
  struct Fetch {
    BufferId buffer;
    uint64_t seq;
    Future<DeviceBufferRef> shard;
    ReplyTo reply;
  };
  using Answer = std::function<void(const ReplyTo& reply, std::vector<v1::CommandEvent> events)>;
  // Hands `answer` the events answering `fetches`: those of one buffer and reader together,
  // once all of them are ready.
  static void AnswerByBuffer(std::vector<Fetch> fetches, Answer answer) {
    while (!fetches.empty()) {
      const BufferId buffer = fetches.front().buffer;
      const ReplyTo reply = fetches.front().reply;
      std::vector<Fetch> group;
      auto others = std::stable_partition(fetches.begin(), fetches.end(), [&](const Fetch& f) {
        return f.buffer == buffer && f.reply.host == reply.host && f.reply.stub == reply.stub &&
               f.reply.mailbox == reply.mailbox;
      });
      std::move(fetches.begin(), others, std::back_inserter(group));
      fetches.erase(fetches.begin(), others);
      struct Answers {
        pw::Mutex mu;
        std::vector<v1::CommandEvent> events ABSL_GUARDED_BY(mu);
        size_t left ABSL_GUARDED_BY(mu);
      };
      auto answers = std::make_shared<Answers>();
      {
        pw::MutexLock lock(&answers->mu);
        answers->events.resize(group.size());
        answers->left = group.size();
      }
      for (size_t i = 0; i < group.size(); ++i) {
        group[i].shard.OnReady([answer, answers, i, seq = group[i].seq,
                                reply](const absl::StatusOr<DeviceBufferRef>& b) {
          MakeShardEvent(seq, b, [answer, answers, i, reply](v1::CommandEvent e) {
            std::vector<v1::CommandEvent> all;
            {
              pw::MutexLock lock(&answers->mu);
              answers->events[i] = std::move(e);
              if (--answers->left > 0) return;
              all = std::move(answers->events);
            }
            answer(reply, std::move(all));
          });
        });
      }
    }
  }

 private:
  // Takes the stream's mail metadata: a controller on this machine mails its commands
  // (MailedCommands naming the stub) and takes the events in its mailbox, where this worker
  // can mail (service_->mail_).
  void TakeMail(grpc::CallbackServerContext* ctx) {
    const std::string stub = Metadata(ctx, kMailStub);
    const std::string first = Metadata(ctx, kMailFirstSeq);
    const std::string mailbox = Metadata(ctx, kReplyMailbox);
    uint64_t stub_id = 0, first_seq = 0;
    if (stub.empty() || service_->mail_ == nullptr || !absl::SimpleAtoi(stub, &stub_id) ||
        stub_id == 0 || !absl::SimpleAtoi(first, &first_seq) ||
        !absl::StartsWith(mailbox, "/pw-mbox-"))
      return;
    sink_->mail_stub = stub_id;
    reply_ = ReplyTo{HostId(), stub_id, mailbox};
    pw::MutexLock lock(&order_mu_);
    next_seq_ = first_seq;
  }

  // Whether mailed commands may be applied now (the stream is not over, and the controller
  // has not closed it); the caller then applies and calls EndApplying.
  bool BeginApplying() {
    pw::MutexLock lock(&mu_);
    if (finished_ || ending_ || reads_done_ || write_failed_) return false;
    ++applying_;
    return true;
  }
  // Ends what BeginApplying began, and finishes the stream if it is to end now. The decision
  // and the count are under one hold of mu_: once it is released, another thread may finish
  // the stream (and gRPC then delete it), so nothing here touches the stream after that.
  void EndApplying() {
    grpc::Status status;
    {
      pw::MutexLock lock(&mu_);
      --applying_;
      if (!ReadyToFinishLocked()) return;
      finished_ = true;
      if (ending_) status = ToGrpc(end_status_);
    }
    Finish(status);
  }

  // Applies commands (moved from) in seq order: those of a mail stream come by mail and on the
  // stream, each way in order, and may overtake each other. One thread at a time applies; one
  // that finds another applying leaves its commands to it.
  void ApplyInOrder(google::protobuf::RepeatedPtrField<v1::Command>* commands) {
    bool overflow = false;
    uint64_t missing = 0;
    {
      pw::MutexLock lock(&order_mu_);
      for (v1::Command& c : *commands)
        if (c.seq() >= next_seq_) early_.emplace(c.seq(), std::move(c));
      // Many waiting behind a missing one (not a backlog an applier is working through).
      overflow = early_.size() > kMaxEarlyCommands && early_.begin()->first != next_seq_;
      missing = next_seq_;
      if (overflow) early_.clear();
      if (ordering_ || overflow) commands = nullptr;
      else ordering_ = true;
    }
    if (overflow) {
      End(sink_, absl::InvalidArgumentError(absl::StrCat(
                     "the command stream skipped command ", missing, ": more than ",
                     kMaxEarlyCommands, " later ones came first")));
    }
    if (commands == nullptr) return;
    std::vector<v1::Command> ready;
    while (true) {
      ready.clear();
      {
        pw::MutexLock lock(&order_mu_);
        for (auto it = early_.begin(); it != early_.end() && it->first == next_seq_;
             it = early_.erase(it), ++next_seq_)
          ready.push_back(std::move(it->second));
        if (ready.empty()) {
          ordering_ = false;
          return;
        }
      }
      for (v1::Command& c : ready) Apply(c);
      AnswerFetches();
    }
  }
  bool ReadyToFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !finished_ && !events_.writing() && applying_ == 0 &&
           (reads_done_ || write_failed_ || ending_);
  }
  void MaybeFinish() {
    grpc::Status status;
    {
      pw::MutexLock lock(&mu_);
      if (!ReadyToFinishLocked()) return;
      finished_ = true;
      if (ending_) status = ToGrpc(end_status_);
    }
    Finish(status);
  }

  // Whether the caller is to Finish the stream now (EndStreams); else it ends once its write or
  // the commands being applied are done (MaybeFinish).
  bool ClaimEnd(const absl::Status& why) {
    pw::MutexLock lock(&mu_);
    if (finished_ || ending_) return false;
    ending_ = true;
    end_status_ = why;
    if (events_.writing() || applying_ > 0) return false;
    finished_ = true;
    return true;
  }

  // Takes what it keeps out of `c` (a put shard's bytes), which the read path then reuses.
  void Apply(v1::Command& c) {
    const uint64_t seq = c.seq();
    auto fail = [&](const absl::Status& s, bool dispatch) {
      if (dispatch && !c.dispatch().ack_enqueue_with_done())
        Send(sink_, seq, v1::CommandEvent::ENQUEUED, s);
      Send(sink_, seq, v1::CommandEvent::DONE, s);
    };
    WorkerInterface* worker = service_->worker_;
    switch (c.command_case()) {
      case v1::Command::kDispatch: {
        const v1::DispatchRequest& d = c.dispatch();
        auto program = service_->Program(d.program_id(), d.has_program() ? &d.program() : nullptr);
        if (!program.ok()) return fail(Annotate(program.status(), "dispatch"), true);
        auto buffers = std::make_shared<std::vector<BufferId>>();
        buffers->reserve(d.buffers_size());
        for (int64_t b : d.buffers()) buffers->push_back(BufferId(b));
        if (d.run() < 0 || d.begin() > d.end() || d.end() > (*program)->nodes.size()) {
          return fail(absl::InvalidArgumentError(absl::StrCat(
                          "dispatch of host program ", d.program_id(), ": nodes [", d.begin(),
                          ", ", d.end(), ") of ", (*program)->nodes.size(), ", run ", d.run())),
                      true);
        }
        if (absl::Status s = CheckBufferMap(**program, *buffers, d.begin(), d.end()); !s.ok())
          return fail(s, true);
        HostWork work{RunId(d.run()), ClientId(d.client()), *program, std::move(buffers), d.begin(),
                      d.end()};
        DispatchAck ack = worker->Dispatch(std::move(work));
        if (!d.ack_enqueue_with_done()) {
          ack.enqueued.OnReady([sink = sink_, seq](const absl::StatusOr<absl::Time>& t) {
            Send(sink, seq, v1::CommandEvent::ENQUEUED, t.status());
          });
        }
        ack.done.OnReady([sink = sink_, seq, enqueued = std::move(ack.enqueued),
                          with_done = d.ack_enqueue_with_done()](
                             const absl::StatusOr<int64_t>& ran) {
          v1::CommandEvent e;
          e.set_seq(seq);
          e.set_kind(v1::CommandEvent::DONE);
          if (ran.ok()) e.set_device_ns(*ran);
          else ToProto(ran.status(), e.mutable_status());
          // Work may end before the last of it is enqueued: then it was enqueued just now.
          if (with_done && enqueued.IsReady()) {
            if (const absl::StatusOr<absl::Time>& at = enqueued.Await(); at.ok())
              e.set_enqueued_before_ns(
                  std::max<int64_t>(0, absl::ToInt64Nanoseconds(absl::Now() - *at)));
          }
          Deliver(sink, std::move(e));
        });
        return;
      }
      case v1::Command::kPutShard: {
        v1::PutShardRequest& p = *c.mutable_put_shard();
        CountTransientBytes(static_cast<int64_t>(p.shard().data().size()));  // gRPC's slices.
        absl::StatusOr<HostArray> shard = FromProto(p.mutable_shard());  // Moves the bytes.
        if (!shard.ok()) return fail(Annotate(shard.status(), "put shard"), false);
        if (p.buffer() < 0 || p.device() < 0)
          return fail(absl::InvalidArgumentError("put shard: negative buffer or device id"), false);
        worker->PutShard(BufferId(p.buffer()), DeviceId(p.device()), *std::move(shard))
            .OnReady([sink = sink_, seq](const absl::Status& s) {
              Send(sink, seq, v1::CommandEvent::DONE, s);
            });
        return;
      }
      case v1::Command::kFetchShard: {
        const v1::ShardRequest& f = c.fetch_shard();
        if (f.buffer() < 0 || f.device() < 0)
          return fail(absl::InvalidArgumentError("fetch shard: negative buffer or device id"), false);
        // Answered with the batch's other fetches of the buffer (AnswerFetches).
        fetches_.push_back({BufferId(f.buffer()), seq,
                            worker->FetchShard(BufferId(f.buffer()), DeviceId(f.device())),
                            ReplyTo{HostId(f.reply_host()), f.reply_stub(), f.reply_mailbox()}});
        return;
      }
      case v1::Command::kClientUpload:
      case v1::Command::kClientFetch: {
        const bool upload = c.has_client_upload();
        const v1::ClientTransferRequest& t = upload ? c.client_upload() : c.client_fetch();
        absl::Status bad = ClientTransferProblem(t, upload);
        if (!bad.ok()) return fail(bad, upload);
        const BufferId buffer(t.buffer());
        const DeviceId device(t.device());
        dataplane::BulkServer* bulk = service_->bulk_;
        if (!upload) {
          worker->FetchShard(buffer, device)
              .OnReady([sink = sink_, seq, bulk, t](const absl::StatusOr<DeviceBufferRef>& b) {
                if (!b.ok()) return Send(sink, seq, v1::CommandEvent::DONE, b.status());
                OfferToClient(sink, seq, bulk, t, *b);
              });
          return;
        }
        // The bytes go straight into the shard's buffer.
        // The shard's memory is made only for a shard the device can hold.
        const ArraySpec spec = *FromProto(t.spec());  // Checked above.
        Promise<DeviceBufferRef> arrived;
        Future<> stored = service_->put_later_(buffer, device, spec, arrived.future());
        if (stored.AwaitFor(absl::ZeroDuration()) && !stored.status().ok())
          return fail(Annotate(stored.status(), "client upload"), true);
        std::shared_ptr<HostDeviceBuffer> dst = HostDeviceBuffer::Create(spec, device);
        char* data = static_cast<char*>(dst->mutable_data());
        // `arrived` is set by the transfer's end, or here if the transfer is refused.
        auto landed = std::make_shared<Promise<DeviceBufferRef>>(std::move(arrived));
        const absl::Status accepted = bulk->AcceptFromClient(
            t.key(), t.buffer(), dst, data, static_cast<size_t>(spec.size_bytes()),
            absl::Now() + ClientTransferTimeout(t, spec.size_bytes()),
            [landed, dst](const absl::Status& s) {
              if (!s.ok()) return landed->Set(Annotate(s, "a client's upload"));
              landed->Set(DeviceBufferRef(dst));
            });
        if (!accepted.ok()) landed->Set(Annotate(accepted, "a client's upload"));
        else SendPort(sink_, seq, v1::CommandEvent::ENQUEUED, bulk->port());
        stored.OnReady([sink = sink_, seq](const absl::Status& s) {
          Send(sink, seq, v1::CommandEvent::DONE, s);
        });
        return;
      }
      case v1::Command::kSaveShard:
      case v1::Command::kLoadShard: {
        const bool save = c.has_save_shard();
        const char* what = save ? "save shard" : "load shard";
        const int64_t buffer = save ? c.save_shard().buffer() : c.load_shard().buffer();
        const int64_t device = save ? c.save_shard().device() : c.load_shard().device();
        if (buffer < 0 || device < 0)
          return fail(absl::InvalidArgumentError(
                          absl::StrCat(what, ": negative buffer or device id")), false);
        absl::StatusOr<ShardFile> file =
            FromProto(save ? c.save_shard().file() : c.load_shard().file());
        if (!file.ok()) return fail(Annotate(file.status(), what), false);
        Future<> done;
        if (save) {
          done = worker->SaveShard(BufferId(buffer), DeviceId(device), *file);
        } else {
          absl::StatusOr<ArraySpec> spec = FromProto(c.load_shard().spec());
          if (!spec.ok()) return fail(Annotate(spec.status(), what), false);
          done = worker->LoadShard(BufferId(buffer), DeviceId(device), *spec, *file);
        }
        done.OnReady([sink = sink_, seq](const absl::Status& s) {
          Send(sink, seq, v1::CommandEvent::DONE, s);
        });
        return;
      }
      case v1::Command::kDeleteBuffers: {
        std::vector<BufferId> ids;
        for (int64_t b : c.delete_buffers().buffers()) ids.push_back(BufferId(b));
        // Clients' transfers of these buffers that have not begun go too (what they hold with
        // them): a client that drops an array it put or read frees its shards now.
        if (service_->bulk_ != nullptr)
          service_->bulk_->WithdrawClientTransfers(c.delete_buffers().buffers(),
                                                   "its array was deleted");
        worker->DeleteBuffers(ids);
        return;
      }
      case v1::Command::kUnload: {
        std::vector<FunctionId> ids;
        for (int64_t f : c.unload().functions()) {
          if (f < 0) return fail(absl::InvalidArgumentError(absl::StrCat(
                                     "command ", seq, ": negative function id ", f)), false);
          ids.push_back(FunctionId(f));
        }
        const std::vector<uint64_t> programs(c.unload().host_programs().begin(),
                                             c.unload().host_programs().end());
        service_->ForgetPrograms(programs);
        worker->Unload(ids, programs);
        return;
      }
      case v1::Command::kCancelRuns:
      case v1::Command::kForgetRuns: {
        const bool cancel = c.has_cancel_runs();
        const auto& ids = cancel ? c.cancel_runs().runs() : c.forget_runs().runs();
        std::vector<RunId> runs;
        for (int64_t r : ids) {
          if (r < 0) return fail(absl::InvalidArgumentError(absl::StrCat(
                                     "command ", seq, ": negative run id ", r)), false);
          runs.push_back(RunId(r));
        }
        if (!cancel) return worker->ForgetRuns(runs);
        absl::Status reason = FromProto(c.cancel_runs().reason());
        if (reason.ok()) reason = absl::CancelledError("cancelled by the controller");
        worker->CancelRuns(runs, reason);
        return;
      }
      case v1::Command::kHosts:
        if (service_->on_hosts_) service_->on_hosts_(c.hosts());
        return;
      case v1::Command::COMMAND_NOT_SET:
        return fail(absl::InvalidArgumentError(absl::StrCat("command ", seq, " is empty")), false);
    }
  }

  // Why a client transfer command cannot be served, if it cannot.
  absl::Status ClientTransferProblem(const v1::ClientTransferRequest& t, bool upload) const {
    const char* what = upload ? "client upload" : "client fetch";
    if (service_->bulk_ == nullptr || (upload && !service_->put_later_))
      return absl::UnimplementedError(absl::StrCat(
          what, ": this worker has no bulk stream for clients (pw worker --bulk-port)"));
    if (t.buffer() < 0 || t.device() < 0)
      return absl::InvalidArgumentError(absl::StrCat(what, ": negative buffer or device id"));
    if (t.key().size() < dataplane::BulkServer::kMinKeyBytes ||
        t.key().size() > dataplane::bulk::kMaxTokenBytes)
      return absl::InvalidArgumentError(absl::StrCat(what, ": a key of ", t.key().size(), " bytes"));
    if (t.timeout_ms() < 0)
      return absl::InvalidArgumentError(absl::StrCat(what, ": a negative timeout"));
    if (!upload) return absl::OkStatus();
    absl::StatusOr<ArraySpec> spec = FromProto(t.spec());
    if (!spec.ok()) return Annotate(spec.status(), what);
    return spec->Validate();
  }
  // How long a transfer of `bytes` waits for its client: as asked, else long enough for the
  // client to reach it behind the others it moves (a minute, and a second per 50 MB).
  static absl::Duration ClientTransferTimeout(const v1::ClientTransferRequest& t, int64_t bytes) {
    const absl::Duration wait = t.timeout_ms() > 0
                                    ? absl::Milliseconds(t.timeout_ms())
                                    : kDefaultClientTransferTimeout + absl::Seconds(bytes / 50e6);
    return std::min(wait, kMaxClientTransferTimeout);
  }
  static void SendPort(const std::shared_ptr<Sink>& sink, uint64_t seq,
                       v1::CommandEvent::Kind kind, int port) {
    v1::CommandEvent e;
    e.set_seq(seq);
    e.set_kind(kind);
    e.set_bulk_port(port);
    Deliver(sink, std::move(e));
  }
  // Offers shard `b` to a client as transfer `t` says (from host memory: a device's shard is
  // copied out first), then answers command `seq`: DONE with the port, or why it was refused.
  static void OfferToClient(const std::shared_ptr<Sink>& sink, uint64_t seq,
                            dataplane::BulkServer* bulk, const v1::ClientTransferRequest& t,
                            const DeviceBufferRef& b) {
    auto offer = [sink, seq, bulk, t](std::shared_ptr<const void> keep, const char* data,
                                      size_t size) {
      const absl::Status s = bulk->OfferToClient(
          t.key(), t.buffer(), std::move(keep), data, size,
          absl::Now() + ClientTransferTimeout(t, static_cast<int64_t>(size)),
          [](const absl::Status&) {});
      if (!s.ok()) return Send(sink, seq, v1::CommandEvent::DONE, Annotate(s, "client fetch"));
      SendPort(sink, seq, v1::CommandEvent::DONE, bulk->port());
    };
    if (const HostDeviceBuffer* host = b->AsHost(); host != nullptr)
      return offer(b, static_cast<const char*>(host->data()), b->size_bytes());
    auto staged = std::make_shared<std::vector<char>>(b->size_bytes());
    b->CopyToHost(staged->data())
        .OnReady([sink, seq, offer, staged, b](const absl::Status& s) {  // b: alive while copied.
          if (!s.ok()) return Send(sink, seq, v1::CommandEvent::DONE, s);
          offer(staged, staged->data(), staged->size());
        });
  }

  // Every value index the dispatched nodes name must be in the run's buffer map.
  static absl::Status CheckBufferMap(const HostProgram& p, const std::vector<BufferId>& buffers,
                                     size_t begin, size_t end) {
    auto check = [&](int v, const NodeWork& n) -> absl::Status {
      if (v < 0 || static_cast<size_t>(v) >= buffers.size() || !buffers[v].valid())
        return absl::InvalidArgumentError(absl::StrCat("dispatch: node '", n.name, "' names value ",
                                                       v, ", which the run's buffer map lacks"));
      return absl::OkStatus();
    };
    for (size_t i = begin; i < end; ++i) {
      const NodeWork& n = p.nodes[i];
      if (const auto* c = std::get_if<ComputeWork>(&n.work)) {
        for (int v : c->inputs) PW_RETURN_IF_ERROR(check(v, n));
        for (int v : c->outputs) PW_RETURN_IF_ERROR(check(v, n));
        for (int v : c->release) PW_RETURN_IF_ERROR(check(v, n));
      } else {
        const auto& t = std::get<TransferWork>(n.work);
        PW_RETURN_IF_ERROR(check(t.src, n));
        PW_RETURN_IF_ERROR(check(t.dst, n));
      }
    }
    return absl::OkStatus();
  }

  WorkerService* const service_;
  const std::shared_ptr<Sink> sink_;
  v1::CommandBatch commands_;  // Only the gRPC read path touches it.
  // A batch's fetches, answered after it (AnswerFetches). Only the thread applying commands
  // touches it (the gRPC read path; for a mail stream, the one ordering them).
  std::vector<Fetch> fetches_;
  ReplyTo reply_;  // A mail stream's: the controller's mailbox (set before any event).
  // A mail stream's commands that wait for an earlier one, by seq; the next seq to apply.
  pw::Mutex order_mu_;
  std::map<uint64_t, v1::Command> early_ ABSL_GUARDED_BY(order_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(order_mu_) = 0;
  bool ordering_ ABSL_GUARDED_BY(order_mu_) = false;  // A thread applies them.
  pw::Mutex mu_;
  BatchQueue<v1::CommandEventBatch> events_ ABSL_GUARDED_BY(mu_);
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int applying_ ABSL_GUARDED_BY(mu_) = 0;  // Batches of commands being applied.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;    // EndStreams: no more reads or writes.
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerBidiReactor<v1::CommandBatch, v1::CommandEventBatch>* WorkerService::Commands(
    grpc::CallbackServerContext* ctx) {
  return new CommandStream(this, ctx);
}

void WorkerService::EndStreams(const absl::Status& why) {
  std::vector<std::shared_ptr<CommandSink>> sinks;
  {
    pw::MutexLock lock(&mu_);
    if (!streams_ended_.has_value()) streams_ended_ = why;
    sinks.assign(command_sinks_.begin(), command_sinks_.end());
  }
  for (const auto& sink : sinks) CommandStream::End(sink, why);
}

// ---------------------------------------------------------------- the data plane's read side

// State shared with the shard's future callbacks, which may run after the RPC is done. gRPC
// calls (StartWrite, Finish) are made without holding `mu`: a reaction may run inline. At most
// one write is outstanding, and Finish is called once, never while a write is outstanding.
class WorkerService::ShardStream final : public grpc::ServerWriteReactor<v1::ShardChunk> {
 public:
  ShardStream(WorkerService* service, grpc::CallbackServerContext* ctx,
              const v1::ShardRequest& req)
      : state_(std::make_shared<State>()) {
    state_->stream = this;
    if (absl::Status s = CheckClusterToken(ctx, service->token_); !s.ok()) {
      End(s);
      return;
    }
    shared_memory_ = req.medium_case() == v1::ShardRequest::kSharedMemory;
    shm_dest_ = req.shared_memory().dest();
    if (req.medium_case() == v1::ShardRequest::kBulk) bulk_ = service->bulk_;
    arena_writer_ = &service->arena_writer_;
    if (req.buffer() < 0 || req.device() < 0) {
      End(absl::InvalidArgumentError("fetch shard: negative buffer or device id"));
      return;
    }
    BeginCallback();
    service->worker_->FetchShard(BufferId(req.buffer()), DeviceId(req.device()))
        .OnReady([state = state_](const absl::StatusOr<DeviceBufferRef>& b) {
          RunCallback(state, [&](ShardStream* stream) {
            if (!b.ok()) return stream->End(b.status());
            stream->Start(*b);
          });
        });
  }

  void OnWriteDone(bool ok) override {
    {
      pw::MutexLock lock(&state_->mu);
      state_->writing = false;
    }
    if (!ok) {
      if (!shm_name_.empty()) dataplane::UnlinkSharedMemory(shm_name_);  // Never delivered.
      return End(absl::CancelledError("fetch shard: the reader went away"));
    }
    if (ticket_ != 0) {  // The bytes go on the bulk stream: the offer's end ends this.
      bool ending;
      {
        pw::MutexLock lock(&state_->mu);
        ending = state_->ending;
      }
      if (ending) End(absl::OkStatus());  // Finishes with the end already set.
      return;
    }
    WriteNext();
  }
  void OnCancel() override { End(absl::CancelledError("fetch shard cancelled")); }
  // Deleted here, or by the last callback still running (it may use this object's members).
  void OnDone() override {
    // An offer not taken is withdrawn; its callback (run here) keeps this alive while it runs.
    if (ticket_ != 0) bulk_->Withdraw(ticket_);
    bool last = false;
    {
      pw::MutexLock lock(&state_->mu);
      state_->done = true;
      last = state_->callbacks == 0;
    }
    if (last) delete this;
  }

 private:
  struct State {
    pw::Mutex mu;
    ShardStream* stream ABSL_GUARDED_BY(mu) = nullptr;
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    absl::Status end ABSL_GUARDED_BY(mu);  // Set: finish with it once no write is outstanding.
    bool ending ABSL_GUARDED_BY(mu) = false;
    int callbacks ABSL_GUARDED_BY(mu) = 0;  // Future callbacks registered and not yet finished.
    bool done ABSL_GUARDED_BY(mu) = false;  // OnDone has run.
  };
  void BeginCallback() {
    pw::MutexLock lock(&state_->mu);
    ++state_->callbacks;
  }
  // Runs `f` on the stream unless it has finished; deletes the stream if OnDone came meanwhile
  // and this was the last callback.
  template <typename F>
  static void RunCallback(const std::shared_ptr<State>& state, F&& f) {
    ShardStream* stream = nullptr;
    {
      pw::MutexLock lock(&state->mu);
      if (!state->done && !state->finished) stream = state->stream;
    }
    if (stream != nullptr) f(stream);
    ShardStream* victim = nullptr;
    {
      pw::MutexLock lock(&state->mu);
      if (--state->callbacks == 0 && state->done) victim = state->stream;
    }
    delete victim;
  }

  // Finishes with `s` now, or after the outstanding write completes.
  void End(const absl::Status& s) {
    absl::Status end;
    {
      pw::MutexLock lock(&state_->mu);
      if (state_->finished) return;
      if (!state_->ending) {
        state_->ending = true;
        state_->end = s;
      }
      if (state_->writing) return;  // OnWriteDone comes back here.
      state_->finished = true;
      end = state_->end;
    }
    Finish(ToGrpc(end));
  }

  // Host-memory buffers are read in place; others are copied to host memory first.
  void Start(const DeviceBufferRef& b) {
    buffer_ = b;
    spec_ = b->spec();
    if (const HostDeviceBuffer* host = b->AsHost(); host != nullptr) {
      data_ = static_cast<const char*>(host->data());
      return WriteNext();
    }
    staged_.resize(b->size_bytes());
    BeginCallback();  // The copy writes into staged_: the stream outlives it.
    b->CopyToHost(staged_.data()).OnReady([state = state_](const absl::Status& s) {
      RunCallback(state, [&](ShardStream* stream) {
        if (!s.ok()) return stream->End(s);
        stream->data_ = stream->staged_.data();
        stream->WriteNext();
      });
    });
  }

  void WriteNext() {
    const size_t total = static_cast<size_t>(spec_.size_bytes());
    if (shared_memory_ && chunks_ == 0 && total > kOneChunkMaxBytes) {
      // One chunk naming where the shard is: the reader's segment, or a fresh one.
      chunk_.Clear();
      ToProto(spec_, chunk_.mutable_spec());
      absl::StatusOr<dataplane::InSharedMemory> where =
          dataplane::PlaceInSharedMemory(*arena_writer_, shm_dest_, data_, total);
      if (!where.ok()) return End(where.status());
      chunk_.mutable_shared_memory()->set_segment(where->segment);
      chunk_.mutable_shared_memory()->set_dest_error(where->dest_error);
      shm_name_ = where->segment;
      offset_ = total;
      ++chunks_;
      {
        pw::MutexLock lock(&state_->mu);
        if (state_->finished || state_->ending) {
          if (!shm_name_.empty()) dataplane::UnlinkSharedMemory(shm_name_);
          return;
        }
        state_->writing = true;
      }
      return StartWrite(&chunk_);
    }
    if (offset_ >= total && chunks_ > 0) return End(absl::OkStatus());
    if (bulk_ != nullptr && chunks_ == 0 && total > kOneChunkMaxBytes) return OfferBulk();
    absl::Status end;
    bool end_now = false;
    {
      pw::MutexLock lock(&state_->mu);
      if (state_->finished) return;
      if (state_->ending) {  // Cancelled while we waited: finish instead of writing.
        state_->finished = true;
        end_now = true;
        end = state_->end;
      } else {
        state_->writing = true;
      }
    }
    if (end_now) return Finish(ToGrpc(end));
    chunk_.Clear();
    if (chunks_ == 0) ToProto(spec_, chunk_.mutable_spec());
    const size_t n = std::min(kChunkBytes, total - offset_);
    chunk_.set_data(data_ + offset_, n);
    offset_ += n;
    ++chunks_;
    StartWrite(&chunk_);
  }

  // Offers the bytes on the bulk stream and sends the ticket, with the spec, as the only chunk.
  // The stream ends when the offer does: read (OK), failed, or withdrawn.
  void OfferBulk() {
    {
      pw::MutexLock lock(&state_->mu);
      if (state_->finished || state_->ending) return;  // End has finished, or will.
      state_->writing = true;
    }
    BeginCallback();  // The offer's callback: this stays alive (with staged_) until it runs.
    ticket_ = bulk_->Offer(buffer_, data_, static_cast<size_t>(spec_.size_bytes()),
                           [state = state_](const absl::Status& s) {
                             RunCallback(state, [&](ShardStream* stream) { stream->End(s); });
                           });
    chunk_.Clear();
    ToProto(spec_, chunk_.mutable_spec());
    chunk_.mutable_bulk()->set_ticket(ticket_);
    chunk_.mutable_bulk()->set_port(bulk_->port());
    offset_ = static_cast<size_t>(spec_.size_bytes());
    ++chunks_;
    StartWrite(&chunk_);
  }

  const std::shared_ptr<State> state_;
  DeviceBufferRef buffer_;  // Kept alive while its bytes are streamed.
  ArraySpec spec_;
  std::string staged_;
  const char* data_ = nullptr;
  size_t offset_ = 0;
  int chunks_ = 0;  // An empty shard still sends one chunk (with the spec).
  bool shared_memory_ = false;
  std::string shm_name_;  // The segment sent, if any.
  std::string shm_dest_;  // The reader's segment to write into, if any.
  dataplane::ShmWriterCache* arena_writer_ = nullptr;
  // Set: the reader takes large shards from the bulk stream.
  dataplane::BulkServer* bulk_ = nullptr;
  uint64_t ticket_ = 0;         // The bulk offer made, if any.
  v1::ShardChunk chunk_;
};

grpc::ServerWriteReactor<v1::ShardChunk>* WorkerService::FetchShard(
    grpc::CallbackServerContext* ctx, const v1::ShardRequest* req) {
  return new ShardStream(this, ctx, *req);
}

// ---------------------------------------------------------------- the rest

grpc::ServerUnaryReactor* WorkerService::RemoveDevice(grpc::CallbackServerContext* ctx,
                                                      const v1::RemoveDeviceRequest* req,
                                                      v1::Empty*) {
  if (absl::Status s = CheckClusterToken(ctx, token_); !s.ok()) return Reply(ctx, s);
  if (req->device() < 0) return Reply(ctx, absl::InvalidArgumentError("RemoveDevice: negative device id"));
  absl::Status reason = FromProto(req->reason());
  if (reason.ok()) reason = absl::UnavailableError("device removed");
  return ReplyWhen(ctx, worker_->RemoveDevice(DeviceId(req->device()), reason));
}

grpc::ServerUnaryReactor* WorkerService::RestoreDevice(grpc::CallbackServerContext* ctx,
                                                       const v1::RemoveDeviceRequest* req,
                                                       v1::Empty*) {
  if (absl::Status s = CheckClusterToken(ctx, token_); !s.ok()) return Reply(ctx, s);
  if (req->device() < 0) return Reply(ctx, absl::InvalidArgumentError("RestoreDevice: negative device id"));
  return ReplyWhen(ctx, worker_->RestoreDevice(DeviceId(req->device())));
}

grpc::ServerUnaryReactor* WorkerService::Status(grpc::CallbackServerContext* ctx,
                                                const v1::Empty*, v1::HostStatus* resp) {
  if (absl::Status s = CheckClusterToken(ctx, token_); !s.ok()) return Reply(ctx, s);
  size_t programs;
  {
    pw::MutexLock lock(&mu_);
    programs = programs_.size();
  }
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  const int64_t commands = commands_received_.load(std::memory_order_relaxed);
  const int64_t messages = command_messages_received_.load(std::memory_order_relaxed);
  const int64_t events = events_sent_.load(std::memory_order_relaxed);
  const int64_t event_messages = event_messages_sent_.load(std::memory_order_relaxed);
  const int64_t mailed = events_mailed_.load(std::memory_order_relaxed);
  worker_->Status().OnReady([r, resp, programs, commands, messages, events, event_messages,
                             mailed](const absl::StatusOr<HostStatus>& status) {
    if (status.ok()) {
      HostStatus s = *status;
      s.programs = programs;
      s.commands_received = commands;
      s.command_messages_received = messages;
      s.events_sent = events;
      s.event_messages_sent = event_messages;
      s.events_mailed = mailed;
      ToProto(s, resp);
    }
    r->Finish(ToGrpc(status.status()));
  });
  return r;
}

grpc::ServerUnaryReactor* WorkerService::Trace(grpc::CallbackServerContext* ctx,
                                               const v1::WorkerTraceRequest* req,
                                               v1::TraceChunk* resp) {
  if (absl::Status s = CheckClusterToken(ctx, token_); !s.ok()) return Reply(ctx, s);
  trace::Recorder& recorder = trace::Recorder::Get();
  pw::MutexLock lock(&mu_);
  if (req->start()) {
    traces_.push_back(recorder.Start());
    return Reply(ctx, absl::OkStatus());
  }
  if (traces_.empty()) return Reply(ctx, absl::OkStatus());  // Started before this process was.
  trace::Chunk chunk;
  chunk.events = recorder.Collect(traces_.front());
  chunk.processes.push_back(recorder.process_id());
  chunk.dropped = recorder.dropped();
  traces_.erase(traces_.begin());
  recorder.Stop();
  trace::Shift(chunk.events, controller_clock_.offset());
  ToProto(chunk, resp);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerService::Collective(grpc::CallbackServerContext* ctx,
                                                    const v1::CollectiveContribution* req,
                                                    v1::Empty*) {
  if (absl::Status s = CheckClusterToken(ctx, token_); !s.ok()) return Reply(ctx, s);
  return Reply(ctx, receive_collective_(*req));
}

grpc::ServerUnaryReactor* WorkerService::Mail(grpc::CallbackServerContext* ctx,
                                              const v1::PeerMail* req, v1::Empty*) {
  if (absl::Status s = CheckClusterToken(ctx, token_); !s.ok()) return Reply(ctx, s);
  if (on_mail_ == nullptr) return Reply(ctx, absl::UnimplementedError("this worker takes no mail"));
  if (req->has_fetches() || req->has_commands())
    return Reply(ctx, absl::InvalidArgumentError(
                          "mail: fetches and commands come only through the mailbox"));
  if (req->events().events_size() > kMaxMailItems)
    return Reply(ctx, absl::InvalidArgumentError(absl::StrCat(
                          "mail: ", req->events().events_size(), " events; at most ",
                          kMaxMailItems)));
  on_mail_(*req);
  return Reply(ctx, absl::OkStatus());
}

void WorkerService::ApplyMailedCommands(v1::MailedCommands& mail) {
  std::shared_ptr<CommandSink> sink;
  {
    pw::MutexLock lock(&mu_);
    auto it = mail_sinks_.find(mail.stub());
    if (it == mail_sinks_.end()) return;  // Its stream is over (it failed what was pending).
    sink = it->second;
  }
  CommandStream::ApplyMailed(sink, mail);
}

void WorkerService::AnswerMailedFetches(
    const v1::MailedFetches& mail,
    std::function<void(const ReplyTo&, std::vector<v1::CommandEvent>)> answer) {
  const ReplyTo reply{HostId(mail.from_host()), mail.stub(), mail.reply_mailbox()};
  std::vector<CommandStream::Fetch> fetches;
  std::vector<v1::CommandEvent> refused;
  for (int i = 0; i < mail.commands_size(); ++i) {
    const v1::Command& c = mail.commands(i);
    const v1::ShardRequest& f = c.fetch_shard();
    if (i >= kMaxMailItems || !c.has_fetch_shard() || f.buffer() < 0 || f.device() < 0) {
      v1::CommandEvent e;
      e.set_seq(c.seq());
      e.set_kind(v1::CommandEvent::DONE);
      ToProto(absl::InvalidArgumentError(absl::StrCat(
                  "mailed command ", c.seq(), ": only fetches of non-negative buffer and device "
                  "ids come by mail, at most ", kMaxMailItems)),
              e.mutable_status());
      refused.push_back(std::move(e));
      continue;
    }
    fetches.push_back({BufferId(f.buffer()), c.seq(),
                       worker_->FetchShard(BufferId(f.buffer()), DeviceId(f.device())), reply});
  }
  if (!refused.empty()) answer(reply, std::move(refused));
  CommandStream::AnswerByBuffer(std::move(fetches), std::move(answer));
}

absl::Status WorkerService::Deliver(Collectives* collectives, const v1::CollectiveContribution& c) {
  if (c.has_error()) {
    absl::Status reason = FromProto(c.error());
    if (reason.ok()) reason = absl::UnknownError("a peer's launch failed");
    collectives->DeliverFailure(c.run(), c.node(), reason);
    return absl::OkStatus();
  }
  const CollectiveKey key{c.run(), c.node(), c.op(), c.group()};
  if (c.phase() != 0) {
    if ((c.phase() != 1 && c.phase() != 2) || c.inputs_size() != 1 || c.offset() < 0)
      return absl::InvalidArgumentError(absl::StrCat("collective: malformed piece of phase ",
                                                     c.phase()));
    collectives->DeliverPiece(key, c.phase(), c.from_process(), static_cast<size_t>(c.offset()),
                              c.inputs(0));
    return absl::OkStatus();
  }
  if (c.ranks_size() != c.inputs_size())
    return absl::InvalidArgumentError(absl::StrCat("collective: ", c.ranks_size(), " ranks but ",
                                                   c.inputs_size(), " inputs"));
  for (int i = 0; i < c.ranks_size(); ++i) collectives->Deliver(key, c.ranks(i), c.inputs(i));
  return absl::OkStatus();
}

}  // namespace pw::rpc
