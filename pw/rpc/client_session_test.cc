// A client's session by mail (ClientSession with Mail, ControllerService::UseMailbox) against a
// mock controller served over loopback gRPC: the order of what the client sends, whichever way
// each batch goes; its runs' events by mail; the controller's checks of what is mailed.
#include "pw/rpc/client_session.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/base/status_matchers.h"
#include "pw/dataplane/shm_mailbox.h"
#include "pw/rpc/auth.h"
#include "pw/rpc/controller_service.h"
#include "pw/rpc/wire.h"
#include "pw/transport/mock_controller.h"

namespace pw::rpc {
namespace {

namespace v1 = ::pathways::v1;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::Return;

constexpr absl::Duration kGuard = absl::Seconds(30);

class ClientSessionMailTest : public ::testing::Test {
 protected:
  // Serves the mock with sessions by mail; `limit` runs in flight per client.
  void Serve(int64_t limit = 4096) {
    EXPECT_CALL(controller_, Connect(_, _)).WillOnce(Return(ClientId(1)));
    ON_CALL(controller_, Disconnect(_)).WillByDefault(Return(absl::OkStatus()));
    service_ = std::make_unique<ControllerService>(&controller_, nullptr, "", "",
                                                   ClientLimits{.max_runs_in_flight = limit});
    auto own = dataplane::ShmMailbox::Create([this](absl::string_view message) {
      v1::PeerMail mail;
      if (mail.ParseFromArray(message.data(), static_cast<int>(message.size())) &&
          mail.has_session())
        service_->ReceiveSessionMail(mail.mutable_session());
    });
    ASSERT_TRUE(own.ok()) << own.status();
    controller_mailbox_ = *std::move(own);
    service_->UseMailbox(controller_mailbox_->name());
    auto serving = StartServer("127.0.0.1:0", {}, service_.get(), false);
    ASSERT_TRUE(serving.ok()) << serving.status();
    serving_ = *std::move(serving);
    stub_ = v1::Controller::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", serving_.port), {}));
    v1::ConnectRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_name("c");
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Connect(&ctx, req, &connected_).ok());
    auto to = dataplane::ShmMailbox::Open(controller_mailbox_->name());
    ASSERT_TRUE(to.ok()) << to.status();
    to_controller_ = *std::move(to);
    auto mine = dataplane::ShmMailbox::Create([this](absl::string_view message) {
      v1::PeerMail mail;
      ASSERT_TRUE(mail.ParseFromArray(message.data(), static_cast<int>(message.size())));
      events_mailed_ += mail.session_events().batch().items_size();
      session_->OnMailedEvents(mail.session_events().batch());
    });
    ASSERT_TRUE(mine.ok()) << mine.status();
    client_mailbox_ = *std::move(mine);
  }
  // Opens the session; its batches go through `send` (false: on the stream) once the
  // controller says it takes mail. `wrong_key`: the session names its mailbox with a key not
  // its own (as a client naming another's mailbox would).
  void Open(std::function<bool(v1::PeerMail*)> send, bool wrong_key = false) {
    ClientSession::Mail mail;
    mail.self_mailbox = client_mailbox_->name();
    mail.self_key = client_mailbox_->key() + (wrong_key ? 1 : 0);
    mail.open = [this, send = std::move(send)](const std::string& name)
        -> absl::StatusOr<std::function<bool(const v1::PeerMail&)>> {
      EXPECT_EQ(name, controller_mailbox_->name());
      return [send](const v1::PeerMail& m) {
        v1::PeerMail copy = m;
        return send(&copy);
      };
    };
    mail.drain = [this] { client_mailbox_->Poll(); };
    session_ = std::make_unique<ClientSession>(
        stub_.get(), ClientId(connected_.client()),
        [key = connected_.client_key()](grpc::ClientContext* ctx) {
          ctx->AddMetadata("pw-client-key", key);
        },
        "the test's controller", std::move(mail));
  }
  bool Deliver(const v1::PeerMail& m) { return to_controller_->Send(m.SerializeAsString()).ok(); }
  static v1::SubmitRequest Run(int64_t program) {
    v1::SubmitRequest r;
    r.set_program(program);
    return r;
  }
  // Submits runs until one goes by mail: the controller has said yes by then.
  void WaitForMail() {
    const absl::Time deadline = absl::Now() + kGuard;
    while (session_->batches_mailed() == 0 && absl::Now() < deadline) {
      Future<RunInfo> run = session_->Submit(Run(0));
      ASSERT_TRUE(run.Await().ok()) << run.status();
      ASSERT_TRUE(run.Await()->done.Await().ok());  // Not counted against the limit from here.
    }
    ASSERT_GT(session_->batches_mailed(), 0) << "the session never mailed";
  }
  void TearDown() override {
    if (client_mailbox_ != nullptr) client_mailbox_->StopDelivering();  // It uses session_.
    session_.reset();
    serving_.Shutdown(absl::Seconds(1));
    if (controller_mailbox_ != nullptr) controller_mailbox_->StopDelivering();
  }

  ::testing::NiceMock<MockController> controller_;
  std::unique_ptr<ControllerService> service_;
  std::unique_ptr<dataplane::ShmMailbox> controller_mailbox_, client_mailbox_;
  std::unique_ptr<dataplane::ShmMailbox> to_controller_;
  Serving serving_;
  std::unique_ptr<v1::Controller::Stub> stub_;
  v1::ConnectResponse connected_;
  std::atomic<int64_t> events_mailed_{0};
  std::unique_ptr<ClientSession> session_;
};

RunInfo Ended(int64_t run) { return RunInfo{RunId(run), {}, Future<>::Ready(absl::OkStatus())}; }

// A client names the mailbox the controller mails its runs' events to: one whose key it does not
// give (a worker's, another client's, another user's) gets none of them. Seen failing before the
// key: the controller mailed this session's events into any mailbox it could open.
TEST_F(ClientSessionMailTest, AMailboxNamedWithoutItsKeyGetsNoMail) {
  Serve();
  ON_CALL(controller_, Submit(_, _, _, _))
      .WillByDefault([](ClientId, ProgramId p, const std::vector<BufferId>&, const RunOptions&) {
        return Future<RunInfo>::Ready(Ended(p.value()));
      });
  Open([&](v1::PeerMail* m) { return Deliver(*m); }, /*wrong_key=*/true);
  for (int i = 1; i <= 20; ++i) {  // Each answered on the stream, after the initial metadata.
    Future<RunInfo> run = session_->Submit(Run(i));
    ASSERT_TRUE(run.Await().ok()) << run.status();
    ASSERT_TRUE(run.Await()->done.Await().ok());
  }
  EXPECT_EQ(session_->batches_mailed(), 0);
  EXPECT_EQ(events_mailed_.load(), 0);
}

// Runs and releases reach the controller in the order the client issued them, though every other
// batch goes on the stream and the mailed ones are held back until all are issued (so the stream
// overtakes them); the runs' events come back by mail.
TEST_F(ClientSessionMailTest, MailedBatchesAndThoseOnTheStreamAreHandledInTheOrderIssued) {
  Serve();
  pw::Mutex mu;
  std::vector<std::string> seen;  // What the controller was asked, in order.
  ON_CALL(controller_, Submit(_, _, _, _))
      .WillByDefault([&](ClientId, ProgramId p, const std::vector<BufferId>&, const RunOptions&) {
        pw::MutexLock lock(&mu);
        if (p.value() > 0) seen.push_back(absl::StrCat("run ", p.value()));
        return Future<RunInfo>::Ready(Ended(p.value()));
      });
  ON_CALL(controller_, ReleaseArray(_, _)).WillByDefault([&](ClientId, BufferId b) {
    pw::MutexLock lock(&mu);
    seen.push_back(absl::StrCat("release ", b.value()));
    return absl::OkStatus();
  });
  bool hold = false;
  int batches = 0;
  std::vector<v1::PeerMail> held;
  Open([&](v1::PeerMail* m) {
    pw::MutexLock lock(&mu);
    if (!hold) return Deliver(*m);
    if (batches++ % 2 == 1) return false;  // On the stream.
    held.push_back(*m);
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(WaitForMail());
  {
    pw::MutexLock lock(&mu);
    hold = true;
  }
  std::vector<std::string> issued;
  std::vector<Future<RunInfo>> runs;
  for (int i = 1; i <= 40; ++i) {
    runs.push_back(session_->Submit(Run(i)));
    session_->Release(BufferId(i));
    issued.push_back(absl::StrCat("run ", i));
    issued.push_back(absl::StrCat("release ", i));
  }
  {
    pw::MutexLock lock(&mu);
    hold = false;
    EXPECT_GT(held.size(), 0u);
    EXPECT_GT(batches, static_cast<int>(held.size())) << "no batch went on the stream";
    for (const v1::PeerMail& m : held) ASSERT_TRUE(Deliver(m));
  }
  for (auto& r : runs) {
    ASSERT_TRUE(r.AwaitFor(kGuard));
    ASSERT_TRUE(r.status().ok()) << r.status();
    ASSERT_TRUE(r.Await()->done.AwaitFor(kGuard));
    EXPECT_TRUE(r.Await()->done.status().ok());
  }
  const absl::Time deadline = absl::Now() + kGuard;
  while (absl::Now() < deadline) {
    pw::MutexLock lock(&mu);
    if (seen.size() >= issued.size()) break;
    mu.Unlock();
    absl::SleepFor(absl::Milliseconds(1));
    mu.Lock();
  }
  pw::MutexLock lock(&mu);
  EXPECT_EQ(seen, issued);
  EXPECT_GT(events_mailed_.load(), 0);
  EXPECT_GT(service_->session_batches_mailed(), 0);
}

// A client that mails more runs than its limit allows (here: a batch the sender fills up) has
// its session ended, naming the limit; its runs fail with that.
TEST_F(ClientSessionMailTest, MailedRunsPastTheLimitEndTheSessionNamingIt) {
  Serve(/*limit=*/2);
  ON_CALL(controller_, Submit(_, _, _, _))
      .WillByDefault([&](ClientId, ProgramId p, const std::vector<BufferId>&, const RunOptions&) {
        return Future<RunInfo>::Ready(Ended(p.value()));
      });
  std::atomic<bool> stuff{false};
  std::atomic<int> stuffed{0};
  Open([&](v1::PeerMail* m) {
    if (stuff.load()) {  // Two more runs in the batch than the client counted.
      ++stuffed;
      for (int i = 0; i < 2; ++i) *m->mutable_session()->mutable_batch()->add_items() =
          m->session().batch().items(0);
    }
    return Deliver(*m);
  });
  ASSERT_NO_FATAL_FAILURE(WaitForMail());
  stuff.store(true);
  Future<RunInfo> run = session_->Submit(Run(7));
  ASSERT_TRUE(run.AwaitFor(kGuard));
  Future<> end = run.status().ok() ? run.Await()->done : Future<>::Ready(run.status());
  ASSERT_TRUE(end.AwaitFor(kGuard));
  EXPECT_EQ(stuffed.load(), 1);  // Run 7 went by mail.
  EXPECT_THAT(end.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                     HasSubstr("mailed 3 runs with 0 in flight (at most 2)")));
}

// A batch mailed twice (its number already handled) ends the session, naming the batch.
TEST_F(ClientSessionMailTest, ABatchMailedTwiceEndsTheSession) {
  Serve();
  ON_CALL(controller_, Submit(_, _, _, _))
      .WillByDefault([&](ClientId, ProgramId p, const std::vector<BufferId>&, const RunOptions&) {
        return Future<RunInfo>::Ready(Ended(p.value()));
      });
  std::vector<v1::PeerMail> sent;
  pw::Mutex mu;
  Open([&](v1::PeerMail* m) {
    pw::MutexLock lock(&mu);
    sent.push_back(*m);
    return Deliver(*m);
  });
  ASSERT_NO_FATAL_FAILURE(WaitForMail());
  Promise<RunInfo> never;
  EXPECT_CALL(controller_, Submit(_, ProgramId(9), _, _)).WillOnce(Return(never.future()));
  Future<RunInfo> pending = session_->Submit(Run(9));
  {
    pw::MutexLock lock(&mu);
    ASSERT_TRUE(Deliver(sent.front()));
  }
  ASSERT_TRUE(pending.AwaitFor(kGuard));
  EXPECT_THAT(pending.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("batch ", sent.front().session().batch().number(),
                                              " came twice"))));
  never.Set(absl::CancelledError("unused"));
}

}  // namespace
}  // namespace pw::rpc
