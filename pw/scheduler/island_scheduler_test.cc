#include "pw/scheduler/island_scheduler.h"

#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

// Records each Dispatch; the test acknowledges enqueues and finishes work (with the device time
// it says) itself.
class FakeWorker final : public WorkerInterface {
 public:
  explicit FakeWorker(HostId h) : host_(h) {}
  HostId host() const override { return host_; }
  Future<> LoadFunction(FunctionId, const FunctionDef&) override {
    return Future<>::Ready(absl::OkStatus());
  }
  DispatchAck Dispatch(HostWork work) override {
    if (before_dispatch_) before_dispatch_(work.run.value());
    pw::MutexLock lock(&mu_);
    std::vector<int> nodes;
    for (size_t i = work.begin; i < work.end; ++i) nodes.push_back(work.program->nodes[i].node);
    messages_.push_back(nodes);
    runs_.push_back(work.run.value());
    threads_.push_back(std::this_thread::get_id());
    ack_at_once_.push_back(work.ack_enqueue_at_once);
    acks_.emplace_back();
    done_.emplace_back();
    return {acks_.back().future(), done_.back().future()};
  }
  Future<> PutShard(BufferId, DeviceId, HostArray) override { return {}; }
  Future<DeviceBufferRef> FetchShard(BufferId, DeviceId) override { return {}; }
  UploadAck ExpectUpload(BufferId, DeviceId, const ArraySpec&) override { return {}; }
  Future<ShardTransfer> OfferShard(BufferId, DeviceId) override { return {}; }
  Future<> SaveShard(BufferId, DeviceId, const ShardFile&) override { return {}; }
  Future<> LoadShard(BufferId, DeviceId, const ArraySpec&, const ShardFile&) override {
    return {};
  }
  void DeleteBuffers(const std::vector<BufferId>&) override {}
  void Unload(const std::vector<FunctionId>&, const std::vector<uint64_t>&) override {}
  void CancelRuns(const std::vector<RunId>&, const absl::Status&) override {}
  void ForgetRuns(const std::vector<RunId>&) override {}
  Future<> RemoveDevice(DeviceId, const absl::Status&) override {
    return Future<>::Ready(absl::OkStatus());
  }
  Future<> RestoreDevice(DeviceId) override { return Future<>::Ready(absl::OkStatus()); }
  Future<HostStatus> Status() const override { return Future<HostStatus>::Ready(HostStatus{}); }

  std::vector<std::vector<int>> messages() {
    pw::MutexLock lock(&mu_);
    return messages_;
  }
  std::vector<int64_t> runs() {
    pw::MutexLock lock(&mu_);
    return runs_;
  }
  // Called at the start of every Dispatch, before it is recorded (set before any dispatch).
  void set_before_dispatch(std::function<void(int64_t run)> f) { before_dispatch_ = std::move(f); }
  // Per dispatch: the thread that made it.
  std::vector<std::thread::id> threads() {
    pw::MutexLock lock(&mu_);
    return threads_;
  }
  // Per dispatch: whether it asked for its enqueue ack at once.
  std::vector<bool> ack_at_once() {
    pw::MutexLock lock(&mu_);
    return ack_at_once_;
  }
  void AckAll(absl::Time at = absl::Now()) {
    std::vector<Promise<absl::Time>> acks;
    {
      pw::MutexLock lock(&mu_);
      for (auto& a : acks_)
        if (a.valid()) acks.push_back(std::move(a));
    }
    for (auto& a : acks) a.Set(at);
  }
  // Finishes dispatch `i` (in dispatch order), having taken `device_ns`.
  void Finish(size_t i, int64_t device_ns) {
    Promise<int64_t> p;
    {
      pw::MutexLock lock(&mu_);
      p = std::move(done_.at(i));
    }
    p.Set(device_ns);
  }

 private:
  HostId host_;
  std::function<void(int64_t run)> before_dispatch_;
  pw::Mutex mu_;
  std::vector<std::vector<int>> messages_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> runs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<Promise<absl::Time>> acks_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> ack_at_once_ ABSL_GUARDED_BY(mu_);
  std::vector<Promise<int64_t>> done_ ABSL_GUARDED_BY(mu_);
};

IslandWork Chain(int nodes, int hosts, DispatchMode mode, int64_t run = 1,
                 std::shared_ptr<const Tenant> tenant = nullptr,
                 std::shared_ptr<HostProgram> program = nullptr) {
  IslandWork w;
  w.run = RunId(run);
  w.mode = mode;
  w.tenant = std::move(tenant);
  if (program == nullptr) {
    program = std::make_shared<HostProgram>();
    static std::atomic<uint64_t> next_id{1};
    program->id = next_id++;
    for (int n = 0; n < nodes; ++n) program->nodes.push_back({n, "n", ComputeWork{}});
  }
  w.buffers = std::make_shared<const std::vector<BufferId>>();
  for (int h = 0; h < hosts; ++h) w.hosts.emplace_back(HostId(h), program);
  return w;
}

template <typename Pred>
void WaitFor(Pred pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!pred() && absl::Now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(pred()) << "not within 10 s";
}

// Waits (bounded) until the scheduler has acted on everything the test did and found nothing
// more it may dispatch.
void Settle(const IslandScheduler& s) {
  WaitFor([&] { return s.settled(); });
}

TEST(IslandSchedulerTest, AnIdleIslandDispatchesOnTheSubmittingThreadAndABusyOneQueues) {
  FakeWorker w0(HostId(0));
  IslandScheduler::Options options;
  options.window = absl::Nanoseconds(1);  // Room for one request at a time.
  options.first_estimate = absl::Milliseconds(1);
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId, uint64_t) -> WorkerInterface* { return &w0; }, options);
  // Nothing queued, nothing in flight: dispatched before Submit returns, by the caller.
  s.Submit(Chain(1, 1, DispatchMode::kParallel, 1));
  EXPECT_THAT(w0.threads(), testing::ElementsAre(std::this_thread::get_id()));
  // The window is full: the next waits in the queue, and the scheduler thread sends it once the
  // first finishes.
  s.Submit(Chain(1, 1, DispatchMode::kParallel, 2));
  Settle(s);
  EXPECT_EQ(w0.runs(), std::vector<int64_t>{1});
  EXPECT_EQ(s.queue_depth(), 1u);
  w0.Finish(0, 10);
  WaitFor([&] { return w0.runs().size() == 2; });
  EXPECT_EQ(w0.runs(), (std::vector<int64_t>{1, 2}));
  EXPECT_THAT(w0.threads(), testing::ElementsAre(std::this_thread::get_id(),
                                                 testing::Ne(std::this_thread::get_id())));
  w0.Finish(1, 10);
}

TEST(IslandSchedulerTest, ARequestSubmittedDuringAnotherThreadsDispatchWaitsItsTurn) {
  FakeWorker w0(HostId(0));
  absl::Notification inside, release;
  w0.set_before_dispatch([&](int64_t run) {
    if (run != 1) return;
    inside.Notify();
    release.WaitForNotification();
  });
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId, uint64_t) -> WorkerInterface* { return &w0; }, {});
  std::thread first([&] { s.Submit(Chain(1, 1, DispatchMode::kParallel, 1)); });
  inside.WaitForNotification();  // `first` is dispatching run 1 (it holds the dispatch token).
  // The window has room, but the island is being dispatched to: run 2 queues.
  s.Submit(Chain(1, 1, DispatchMode::kParallel, 2));
  EXPECT_TRUE(w0.runs().empty());
  EXPECT_EQ(s.queue_depth(), 1u);
  const std::thread::id first_id = first.get_id();
  release.Notify();
  first.join();
  // Run 1 went first, from `first`; run 2 after it, from the scheduler thread.
  WaitFor([&] { return w0.runs().size() == 2; });
  EXPECT_EQ(w0.runs(), (std::vector<int64_t>{1, 2}));
  EXPECT_THAT(w0.threads(), testing::ElementsAre(first_id, testing::Ne(std::this_thread::get_id())));
  w0.Finish(0, 10);
  w0.Finish(1, 10);
}

TEST(IslandSchedulerTest, ADeferredDispatchHoldsTheIslandUntilItsSubmitterRunsIt) {
  FakeWorker w0(HostId(0));
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId, uint64_t) -> WorkerInterface* { return &w0; }, {});
  {
    IslandScheduler::InlineDispatch later;
    s.Submit(Chain(1, 1, DispatchMode::kParallel, 1), &later);
    EXPECT_TRUE(w0.runs().empty());  // Popped for this thread, not sent yet.
    s.Submit(Chain(1, 1, DispatchMode::kParallel, 2));
    EXPECT_TRUE(w0.runs().empty());  // Run 2 waits behind it (the token is `later`'s).
    EXPECT_EQ(s.queue_depth(), 1u);
    later.Run();  // Sends run 1 from this thread; then the scheduler thread takes run 2.
  }
  WaitFor([&] { return w0.runs().size() == 2; });
  EXPECT_EQ(w0.runs(), (std::vector<int64_t>{1, 2}));
  EXPECT_THAT(w0.threads(), testing::ElementsAre(std::this_thread::get_id(),
                                                 testing::Ne(std::this_thread::get_id())));
  w0.Finish(0, 10);
  w0.Finish(1, 10);
}

TEST(IslandSchedulerTest, ParallelSendsOneMessagePerHost) {
  FakeWorker w0(HostId(0)), w1(HostId(1));
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId h, uint64_t) -> WorkerInterface* {
                      return h.value() == 0 ? &w0 : &w1;
                    }, {});
  DispatchAck ack = s.Submit(Chain(5, 2, DispatchMode::kParallel));
  WaitFor([&] { return !w1.messages().empty(); });
  EXPECT_EQ(w0.messages(), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(w1.messages(), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
  // Parallel work need not be acknowledged as enqueued before it ends (one answer, not two).
  EXPECT_THAT(w0.ack_at_once(), testing::ElementsAre(false));
  const absl::Time t = absl::FromUnixSeconds(1000);
  w0.AckAll(t + absl::Seconds(1));
  w1.AckAll(t);
  w0.Finish(0, 30);
  w1.Finish(0, 12);
  EXPECT_EQ(ack.enqueued.Await().value(), t + absl::Seconds(1));  // When the last host was.
  EXPECT_EQ(ack.done.Await().value(), 42);  // The hosts' device time, summed.
}

TEST(IslandSchedulerTest, SequentialWaitsForEachNodeToBeEnqueuedWithoutHoldingTheThread) {
  FakeWorker w0(HostId(0)), w1(HostId(1));
  IslandScheduler::Options o;
  o.window = absl::Hours(1);  // Only the sequential dispatch holds anything back.
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId h, uint64_t) -> WorkerInterface* {
                      return h.value() == 0 ? &w0 : &w1;
                    }, o);
  DispatchAck ack = s.Submit(Chain(3, 2, DispatchMode::kSequential));
  for (int node = 0; node < 3; ++node) {
    WaitFor([&] { return w1.messages().size() == static_cast<size_t>(node + 1); });
    // Nothing further goes out until this node's enqueue is acknowledged, and the scheduler's
    // thread is free meanwhile: it takes a parallel request, and holds it (one order).
    DispatchAck other = s.Submit(Chain(1, 1, DispatchMode::kParallel, 100 + node));
    Settle(s);
    EXPECT_EQ(w0.messages().size(), static_cast<size_t>(node + 1));
    EXPECT_EQ(w0.messages().back(), std::vector<int>{node});
    w0.AckAll();
    w1.AckAll();
    if (node == 2) {
      // The sequential request is out: the parallel ones follow, in order.
      WaitFor([&] { return w0.runs().size() == 6; });
      EXPECT_THAT(w0.runs(), testing::ElementsAre(1, 1, 1, 100, 101, 102));
      // Sequential dispatch waits for each enqueue ack, so it asks for them at once.
      EXPECT_THAT(w0.ack_at_once(), testing::ElementsAre(true, true, true, false, false, false));
    }
  }
  EXPECT_TRUE(ack.enqueued.status().ok());
  for (size_t i = 0; i < 6; ++i) w0.Finish(i, 1);  // The scheduler waits for its work to end.
  for (size_t i = 0; i < 3; ++i) w1.Finish(i, 1);
  EXPECT_EQ(ack.done.Await().value(), 6);
}

TEST(IslandSchedulerTest, FifoOrderAcrossRequestsAndMissingWorker) {
  FakeWorker w0(HostId(0));
  IslandScheduler::Options o;
  o.window = absl::Hours(1);  // Everything at once.
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId h, uint64_t) -> WorkerInterface* {
                      return h.value() == 0 ? &w0 : nullptr;
                    },
                    o);
  std::vector<DispatchAck> acks;
  for (int i = 0; i < 10; ++i) acks.push_back(s.Submit(Chain(1, 1, DispatchMode::kParallel, i)));
  DispatchAck orphan = s.Submit(Chain(1, 2, DispatchMode::kParallel, 10));
  WaitFor([&] { return w0.messages().size() == 11; });
  w0.AckAll();
  for (int i = 0; i < 11; ++i) w0.Finish(i, 1);
  EXPECT_EQ(orphan.done.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(orphan.done.status().message(), testing::HasSubstr("host:1 has no worker"));
  for (auto& a : acks) EXPECT_TRUE(a.enqueued.status().ok());
  EXPECT_THAT(w0.runs(), testing::ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
}

// Issue 24: the scheduler keeps a window of estimated device time in flight and dispatches the
// next request as work completes; measured device time replaces the first estimate.
TEST(IslandSchedulerTest, KeepsAWindowOfDeviceTimeInFlightAndFeedsTheDevicesOnCompletion) {
  FakeWorker w0(HostId(0));
  IslandScheduler::Options o;
  o.devices = 1;
  o.window = absl::Milliseconds(2);
  o.first_estimate = absl::Milliseconds(1);
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId, uint64_t) -> WorkerInterface* { return &w0; }, o);
  auto program = std::make_shared<HostProgram>();
  program->id = 77;
  program->nodes.push_back({0, "n", ComputeWork{}});
  std::vector<DispatchAck> acks;
  for (int i = 0; i < 8; ++i)
    acks.push_back(s.Submit(Chain(1, 1, DispatchMode::kParallel, i, nullptr, program)));
  // 1 ms estimated each: two fill the 2 ms window; the rest wait.
  WaitFor([&] { return w0.runs().size() == 2; });
  Settle(s);
  EXPECT_EQ(w0.runs().size(), 2u);
  EXPECT_EQ(s.queue_depth(), 6u);
  EXPECT_EQ(s.in_flight(), 2);
  // The first finishes, having taken 0.5 ms: the next goes, estimated at 0.5 ms from now on.
  w0.Finish(0, 500'000);
  WaitFor([&] { return w0.runs().size() >= 3; });
  Settle(s);
  // In flight: run 1 (1 ms estimated), then 0.5 ms ones until 2 ms: runs 2 and 3.
  EXPECT_EQ(w0.runs().size(), 4u);
  EXPECT_TRUE(acks[0].done.Await().ok());
  // Finishing everything drains the queue, a window at a time.
  for (size_t i = 1; i < 8; ++i) {
    WaitFor([&] { return w0.runs().size() > i; });
    w0.Finish(i, 500'000);
  }
  for (auto& a : acks) EXPECT_EQ(a.done.Await().value(), 500'000);
  EXPECT_EQ(s.in_flight(), 0);
}

// The window is kept on top of the island's control round trip (dispatch to the hosts'
// enqueue, as their answers report it), so hosts that answer slowly still keep their devices fed.
TEST(IslandSchedulerTest, WidensTheWindowByTheMeasuredRoundTrip) {
  FakeWorker w0(HostId(0));
  const absl::Time now = absl::FromUnixSeconds(1000);
  IslandScheduler::Options o;
  o.devices = 1;
  o.window = absl::Milliseconds(1);
  o.first_estimate = absl::Milliseconds(1);
  o.now = [now] { return now; };  // Every dispatch goes at `now`.
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId, uint64_t) -> WorkerInterface* { return &w0; }, o);
  auto program = std::make_shared<HostProgram>();
  program->id = 78;
  program->nodes.push_back({0, "n", ComputeWork{}});
  for (int i = 0; i < 16; ++i) s.Submit(Chain(1, 1, DispatchMode::kParallel, i, nullptr, program));
  Settle(s);
  EXPECT_EQ(w0.runs().size(), 1u);  // 1 ms estimated fills the 1 ms window.
  EXPECT_EQ(s.round_trip(), absl::ZeroDuration());
  // Its host says it enqueued the work 4 ms after the dispatch; it took 1 ms. The round trip
  // (a moving average: a quarter of the first sample) counts twice on top of the window:
  // 1 + 2 x 1 ms = 3 ms, three requests of 1 ms.
  w0.AckAll(now + absl::Milliseconds(4));
  w0.Finish(0, 1'000'000);
  Settle(s);
  EXPECT_EQ(s.round_trip(), absl::Milliseconds(1));
  EXPECT_EQ(s.in_flight(), 3);
  EXPECT_EQ(w0.runs().size(), 4u);
  // A sample past kMaxRoundTrip (a stalled host) counts as kMaxRoundTrip.
  w0.AckAll(now + absl::Hours(1));
  w0.Finish(1, 1'000'000);
  Settle(s);
  EXPECT_EQ(s.round_trip(),
            (3 * absl::Milliseconds(1) + IslandScheduler::kMaxRoundTrip) / 4);
  for (size_t i = 2; i < 16; ++i) {
    WaitFor([&] { return w0.runs().size() > i; });
    w0.Finish(i, 1'000'000);
  }
  EXPECT_EQ(s.in_flight(), 0);
}

// Through the scheduler: tenants' requests interleave by share, and the tenants' loads report
// what each was given.
TEST(IslandSchedulerTest, TenantsShareTheIslandByTheirShares) {
  FakeWorker w0(HostId(0));
  absl::Time now = absl::FromUnixSeconds(1000);
  IslandScheduler::Options o;
  o.window = absl::Nanoseconds(1);  // One at a time: the policy picks each.
  o.now = [&now] { return now; };
  auto a = std::make_shared<Tenant>(0, "a", 1), b = std::make_shared<Tenant>(1, "b", 3);
  IslandScheduler s(IslandId(0), std::make_unique<SharePolicy>(),
                    [&](HostId, uint64_t) -> WorkerInterface* { return &w0; }, o);
  auto pa = std::make_shared<HostProgram>(), pb = std::make_shared<HostProgram>();
  pa->id = 1001;
  pb->id = 1002;
  pa->nodes.push_back({0, "n", ComputeWork{}});
  pb->nodes.push_back({0, "n", ComputeWork{}});
  // Both backlogged (submitted before the first finishes: the first goes at once).
  for (int i = 0; i < 40; ++i) {
    s.Submit(Chain(1, 1, DispatchMode::kParallel, i, a, pa));
    s.Submit(Chain(1, 1, DispatchMode::kParallel, 100 + i, b, pb));
  }
  Settle(s);
  for (size_t i = 0; i < 40; ++i) {
    WaitFor([&] { return w0.runs().size() > i; });
    w0.Finish(i, 1'000'000);
  }
  WaitFor([&] { return w0.runs().size() == 41; });
  std::map<int, int> got;
  for (int64_t run : w0.runs()) {
    if (got[0] + got[1] == 40) break;
    ++got[run >= 100];
  }
  // After the first (which went before the rest came), 39 at 1:3.
  EXPECT_NEAR(got[1], 30, 2);
  EXPECT_NEAR(got[0], 10, 2);
  std::vector<IslandScheduler::TenantLoad> loads = s.TenantLoads();
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].tenant->name(), "a");
  EXPECT_EQ(loads[0].device_ns_last_second + loads[1].device_ns_last_second, 40'000'000);
  EXPECT_EQ(loads[0].queued + loads[1].queued, 80 - 41);
  now += absl::Seconds(2);  // A second later, none of it is recent.
  for (const auto& l : s.TenantLoads()) EXPECT_EQ(l.device_ns_last_second, 0);
  for (size_t i = 40; i < 80; ++i) {
    WaitFor([&] { return w0.runs().size() > i; });
    w0.Finish(i, 1'000'000);
  }
}

}  // namespace
}  // namespace pw
