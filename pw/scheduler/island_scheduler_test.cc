#include "pw/scheduler/island_scheduler.h"

#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

// Records each Dispatch; enqueue acks are released by the test.
class FakeWorker final : public WorkerInterface {
 public:
  explicit FakeWorker(HostId h) : host_(h) {}
  HostId host() const override { return host_; }
  absl::Status LoadFunction(FunctionId, const FunctionDef&) override {
    return absl::OkStatus();
  }
  DispatchAck Dispatch(HostWork work) override {
    pw::MutexLock lock(&mu_);
    std::vector<int> nodes;
    for (size_t i = work.begin; i < work.end; ++i) nodes.push_back(work.program->nodes[i].node);
    messages_.push_back(nodes);
    acks_.emplace_back();
    return {acks_.back().future(), Future<>::Ready(absl::OkStatus())};
  }
  Future<> PutShard(BufferId, DeviceId, HostArray) override { return {}; }
  Future<DeviceBufferRef> FetchShard(BufferId, DeviceId) override { return {}; }
  UploadAck ExpectUpload(BufferId, DeviceId, const ArraySpec&) override { return {}; }
  Future<ShardTransfer> OfferShard(BufferId, DeviceId) override { return {}; }
  void DeleteBuffers(const std::vector<BufferId>&) override {}
  void Unload(const std::vector<FunctionId>&, const std::vector<uint64_t>&) override {}
  void CancelRuns(const std::vector<RunId>&, const absl::Status&) override {}
  void ForgetRuns(const std::vector<RunId>&) override {}
  absl::Status RemoveDevice(DeviceId, const absl::Status&) override { return absl::OkStatus(); }
  absl::Status RestoreDevice(DeviceId) override { return absl::OkStatus(); }
  absl::StatusOr<HostStatus> Status() const override { return HostStatus{}; }

  std::vector<std::vector<int>> messages() {
    pw::MutexLock lock(&mu_);
    return messages_;
  }
  void AckAll() {
    pw::MutexLock lock(&mu_);
    for (auto& a : acks_)
      if (a.valid()) a.Set();
  }

 private:
  HostId host_;
  pw::Mutex mu_;
  std::vector<std::vector<int>> messages_ ABSL_GUARDED_BY(mu_);
  std::vector<Promise<>> acks_ ABSL_GUARDED_BY(mu_);
};

IslandWork Chain(int nodes, int hosts, DispatchMode mode) {
  IslandWork w;
  w.run = RunId(1);
  w.mode = mode;
  auto program = std::make_shared<HostProgram>();
  for (int n = 0; n < nodes; ++n) program->nodes.push_back({n, "n", ComputeWork{}});
  w.buffers = std::make_shared<const std::vector<BufferId>>();
  for (int h = 0; h < hosts; ++h) w.hosts.emplace_back(HostId(h), program);
  return w;
}

TEST(IslandSchedulerTest, ParallelSendsOneMessagePerHost) {
  FakeWorker w0(HostId(0)), w1(HostId(1));
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId h) -> WorkerInterface* { return h.value() == 0 ? &w0 : &w1; });
  DispatchAck ack = s.Submit(Chain(5, 2, DispatchMode::kParallel));
  while (w1.messages().empty()) std::this_thread::yield();
  EXPECT_EQ(w0.messages(), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(w1.messages(), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
  w0.AckAll();
  w1.AckAll();
  EXPECT_TRUE(ack.enqueued.status().ok());
  EXPECT_TRUE(ack.done.status().ok());
}

TEST(IslandSchedulerTest, SequentialWaitsForEachNodeToBeEnqueued) {
  FakeWorker w0(HostId(0)), w1(HostId(1));
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId h) -> WorkerInterface* { return h.value() == 0 ? &w0 : &w1; });
  DispatchAck ack = s.Submit(Chain(3, 2, DispatchMode::kSequential));
  for (int node = 0; node < 3; ++node) {
    while (w1.messages().size() < static_cast<size_t>(node + 1)) std::this_thread::yield();
    absl::SleepFor(absl::Milliseconds(20));
    // Nothing further goes out until this node's enqueue is acknowledged.
    EXPECT_EQ(w0.messages().size(), static_cast<size_t>(node + 1));
    EXPECT_EQ(w0.messages().back(), std::vector<int>{node});
    w0.AckAll();
    w1.AckAll();
  }
  EXPECT_TRUE(ack.enqueued.status().ok());
}

TEST(IslandSchedulerTest, FifoOrderAcrossRequestsAndMissingWorker) {
  FakeWorker w0(HostId(0));
  IslandScheduler s(IslandId(0), std::make_unique<FifoPolicy>(),
                    [&](HostId h) -> WorkerInterface* { return h.value() == 0 ? &w0 : nullptr; });
  std::vector<DispatchAck> acks;
  for (int i = 0; i < 10; ++i) acks.push_back(s.Submit(Chain(1, 1, DispatchMode::kParallel)));
  DispatchAck orphan = s.Submit(Chain(1, 2, DispatchMode::kParallel));
  while (w0.messages().size() < 11) std::this_thread::yield();
  w0.AckAll();
  EXPECT_EQ(orphan.done.status().code(), absl::StatusCode::kUnavailable);
  while (s.dispatched() < 11) std::this_thread::yield();
  for (auto& a : acks) EXPECT_TRUE(a.enqueued.status().ok());
}

}  // namespace
}  // namespace pw
