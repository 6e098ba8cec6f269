#include "pw/executor/collectives.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "gtest/gtest.h"

namespace pw {
namespace {

// Inputs from other processes and failure records are dropped once their run is forgotten, and
// inputs of a forgotten run that still arrive are not kept.
TEST(CollectivesTest, ForgetRunDropsRecordsAndLateInputs) {
  Collectives c;
  c.Deliver({.run = 1, .node = 0, .op = 0}, 1, "early input of run 1");
  c.Deliver({.run = 2, .node = 0, .op = 0}, 1, "early input of run 2");
  c.FailLaunch(3, 0, absl::InternalError("a shard of run 3 failed"));
  EXPECT_EQ(c.records(), 3u);
  c.ForgetRun(1);
  c.ForgetRun(3);
  EXPECT_EQ(c.records(), 1u);  // Run 2's input: its run has not ended.
  // Stragglers of forgotten runs are dropped.
  c.Deliver({.run = 1, .node = 0, .op = 1}, 1, "late");
  c.Deliver({.run = 3, .node = 0, .op = 0}, 1, "late");
  EXPECT_EQ(c.records(), 1u);
  c.ForgetRun(2);
  EXPECT_EQ(c.records(), 0u);
  // The memory of forgotten runs is bounded: the oldest are forgotten for good.
  for (int64_t r = 10; r < 10 + static_cast<int64_t>(Collectives::kForgottenRuns); ++r)
    c.ForgetRun(r);
  c.Deliver({.run = 1, .node = 0, .op = 0}, 1, "much later");
  EXPECT_EQ(c.records(), 1u);
}

// A cancelled run's shard waiting for its peer fails with the cancellation, as does a later
// shard of the run; forgetting the run drops the record.
TEST(CollectivesTest, CancelRunFailsItsPendingAndLaterCollectives) {
  Collectives c;
  const std::vector<DeviceId> devices = {DeviceId(0), DeviceId(1)};
  const float in = 1;
  float out = 0;
  auto sum = [](void* acc, const void* x, size_t) {
    *static_cast<float*>(acc) += *static_cast<const float*>(x);
  };
  absl::Status waited;
  std::thread rank0([&] {
    waited = c.AllReduce({.run = 7, .node = 0, .op = 0}, devices, 0, &in, &out, 4, 4, sum);
  });
  while (c.pending() == 0) std::this_thread::yield();  // Rank 0 waits for rank 1.
  c.CancelRun(7, absl::DeadlineExceededError("run:7 overran its timeout"));
  rank0.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  absl::Status later = c.AllReduce({.run = 7, .node = 1, .op = 0}, devices, 1, &in, &out, 4, 4, sum);
  EXPECT_EQ(later.code(), absl::StatusCode::kDeadlineExceeded) << later;
  EXPECT_EQ(c.pending(), 0u);
  EXPECT_EQ(c.records(), 1u);
  c.ForgetRun(7);
  EXPECT_EQ(c.records(), 0u);
}

// Devices 0 and 1 are this process's; device 2 is another's, whose input arrives as soon as
// ours are sent.
class OneRemotePeer : public CollectivePeers {
 public:
  explicit OneRemotePeer(Collectives* c) : c_(c) {}
  bool IsLocal(DeviceId d) const override { return d.value() < 2; }
  void Send(const CollectiveKey& key, absl::Span<const DeviceId>, std::vector<int>,
            std::vector<std::string> inputs) override {
    c_->Deliver(key, 2, inputs[0]);
  }
  void SendFailure(int64_t, int32_t, absl::Span<const DeviceId>, const absl::Status&) override {}
  Processes ProcessesOf(absl::Span<const DeviceId>) const override { return {2, 0}; }
  void SendPiece(const CollectiveKey&, absl::Span<const DeviceId>, int, int, int, size_t,
                 std::string) override {}

 private:
  Collectives* c_;
};

// A device removed while the last local shard combines the other process's input: the combine
// writes every local shard's output, so no local shard may return before it ends (the removal
// loses the race and the collective completes).
TEST(CollectivesTest, RemovalDuringACrossProcessCombineWaitsForIt) {
  Collectives c;
  OneRemotePeer peer(&c);
  c.SetPeers(&peer);
  const std::vector<DeviceId> devices = {DeviceId(0), DeviceId(1), DeviceId(2)};
  float in[2] = {1, 2}, out[2] = {0, 0};
  std::atomic<bool> returned[2] = {false, false};
  std::atomic<int> combines{0};
  std::atomic<bool> returned_during_combine{false};
  std::thread remover;
  // Runs on whichever local shard arrives last.
  auto combine = [&](absl::Span<const void* const> ins, absl::Span<void* const> outs) {
    ++combines;
    remover = std::thread(
        [&] { c.AbortDevice(DeviceId(0), absl::UnavailableError("device 0 removed")); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Time for the removal to run.
    returned_during_combine = returned[0] || returned[1];
    float sum = 0;
    for (const void* p : ins) sum += *static_cast<const float*>(p);
    for (void* p : outs) *static_cast<float*>(p) = sum;
    return absl::OkStatus();
  };
  absl::Status status[2];
  std::vector<std::thread> shards;
  for (int rank = 0; rank < 2; ++rank) {
    shards.emplace_back([&, rank] {
      status[rank] = c.Run({.run = 1, .node = 0, .op = 0}, devices, rank, &in[rank], 4,
                           &out[rank], 4, combine);
      returned[rank] = true;
    });
  }
  for (auto& t : shards) t.join();
  if (remover.joinable()) remover.join();
  EXPECT_EQ(combines, 1);
  EXPECT_FALSE(returned_during_combine);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(status[rank].ok()) << rank << ": " << status[rank];
    EXPECT_EQ(out[rank], 4.0f);  // 1 + 2 + the other process's input (a copy of rank 0's).
  }
}

// Device 2 is another process's, whose input a receiver thread delivers once ours are sent.
class ThreadedRemotePeer : public CollectivePeers {
 public:
  bool IsLocal(DeviceId d) const override { return d.value() < 2; }
  void Send(const CollectiveKey& key, absl::Span<const DeviceId>, std::vector<int>,
            std::vector<std::string> inputs) override {
    pw::MutexLock lock(&mu);
    sent_key = key;
    sent_input = inputs[0];
  }
  void SendFailure(int64_t, int32_t, absl::Span<const DeviceId>, const absl::Status&) override {}
  Processes ProcessesOf(absl::Span<const DeviceId>) const override { return {2, 0}; }
  void SendPiece(const CollectiveKey&, absl::Span<const DeviceId>, int, int, int, size_t,
                 std::string) override {}
  // Waits for Send, then returns what was sent.
  std::pair<CollectiveKey, std::string> AwaitSend() {
    pw::MutexLock lock(&mu);
    mu.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return sent_key.has_value(); });
    auto r = std::make_pair(*sent_key, sent_input);
    sent_key.reset();
    return r;
  }

 private:
  pw::Mutex mu;
  std::optional<CollectiveKey> sent_key ABSL_GUARDED_BY(mu);
  std::string sent_input ABSL_GUARDED_BY(mu);
};

// The thread that delivers the last remote input after the local inputs are sent combines, so
// the step does not wait for the combining shard to run again; when it races with the combining
// shard, exactly one of them combines.
TEST(CollectivesTest, TheLastDeliveryCombines) {
  Collectives c;
  ThreadedRemotePeer peer;
  c.SetPeers(&peer);
  const std::vector<DeviceId> devices = {DeviceId(0), DeviceId(1), DeviceId(2)};
  for (int step = 0; step < 200; ++step) {
    const bool late = step == 0;  // Delivered well after the send, then at once.
    float in[2] = {1, static_cast<float>(step)}, out[2] = {0, 0};
    std::atomic<int> combines{0};
    std::thread::id combined_on;
    auto combine = [&](absl::Span<const void* const> ins, absl::Span<void* const> outs) {
      ++combines;
      combined_on = std::this_thread::get_id();
      float sum = 0;
      for (const void* p : ins) sum += *static_cast<const float*>(p);
      for (void* p : outs) *static_cast<float*>(p) = sum;
      return absl::OkStatus();
    };
    std::thread receiver([&] {
      auto [key, input] = peer.AwaitSend();
      if (late) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      c.Deliver(key, 2, input);
    });
    const std::thread::id receiver_id = receiver.get_id();
    absl::Status status[2];
    std::vector<std::thread> shards;
    for (int rank = 0; rank < 2; ++rank) {
      shards.emplace_back([&, rank] {
        status[rank] = c.Run({.run = 1, .node = step, .op = 0}, devices, rank, &in[rank], 4,
                             &out[rank], 4, combine);
      });
    }
    for (auto& t : shards) t.join();
    receiver.join();
    ASSERT_EQ(combines, 1) << "step " << step;
    if (late) {
      EXPECT_EQ(combined_on, receiver_id);
    }
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << status[rank];
      // 1 + step + the other process's input (a copy of rank 0's).
      EXPECT_EQ(out[rank], 2.0f + step) << "step " << step << " rank " << rank;
    }
  }
}

// P "processes", each a Collectives of its own holding devices [2p, 2p + 1], whose peers deliver
// to each other on the sending thread (as the mailbox receiver would, on another thread).
class FakeProcesses {
 public:
  explicit FakeProcesses(int procs) {
    for (int p = 0; p < procs; ++p) {
      procs_.push_back(std::make_unique<Proc>(this, p));
      procs_.back()->c.SetPeers(procs_.back().get());
    }
  }
  Collectives& of(int p) { return procs_[p]->c; }
  int64_t bytes_sent() const { return sent_.load(); }
  // Process `p` drops everything it would send (a stalled peer).
  void Silence(int p) { procs_[p]->silent = true; }

 private:
  struct Proc : CollectivePeers {
    Proc(FakeProcesses* all, int self) : all(all), self(self) {}
    bool IsLocal(DeviceId d) const override { return d.value() / 2 == self; }
    void Send(const CollectiveKey& key, absl::Span<const DeviceId> devices, std::vector<int> ranks,
              std::vector<std::string> inputs) override {
      if (silent) return;
      for (auto& other : all->procs_) {
        if (other.get() == this) continue;
        for (size_t i = 0; i < ranks.size(); ++i) {
          all->sent_ += inputs[i].size();
          other->c.Deliver(key, ranks[i], inputs[i]);
        }
      }
    }
    void SendFailure(int64_t, int32_t, absl::Span<const DeviceId>, const absl::Status&) override {}
    Processes ProcessesOf(absl::Span<const DeviceId> devices) const override {
      return {static_cast<int>(devices.size() / 2), self};  // Ranks 2p, 2p + 1 on process p.
    }
    void SendPiece(const CollectiveKey& key, absl::Span<const DeviceId>, int phase, int to,
                   int from, size_t offset, std::string bytes) override {
      if (silent) return;
      all->sent_ += bytes.size();
      all->procs_[to]->c.DeliverPiece(key, phase, from, offset, std::move(bytes));
    }
    FakeProcesses* all;
    const int self;
    std::atomic<bool> silent{false};
    Collectives c;
  };
  std::vector<std::unique_ptr<Proc>> procs_;
  std::atomic<int64_t> sent_{0};
};

// Runs a float sum AllReduce of `n` elements on every device of `procs` processes (2 each); rank
// r's input is (r + 1) * (i % 7). Returns each rank's status and whether its output was right.
std::vector<std::pair<absl::Status, bool>> SumEverywhere(
    FakeProcesses& f, int procs, size_t n, int64_t run,
    Collectives::Algorithm algorithm = Collectives::Algorithm::kAuto) {
  std::vector<DeviceId> devices;
  for (int d = 0; d < 2 * procs; ++d) devices.push_back(DeviceId(d));
  std::vector<std::pair<absl::Status, bool>> result(devices.size());
  std::vector<std::thread> shards;
  auto reduce = [](void* acc, const void* x, size_t bytes) {
    for (size_t i = 0; i < bytes / 4; ++i)
      static_cast<float*>(acc)[i] += static_cast<const float*>(x)[i];
  };
  float total = 0;
  for (size_t r = 0; r < devices.size(); ++r) total += r + 1;
  for (size_t r = 0; r < devices.size(); ++r) {
    shards.emplace_back([&, r] {
      std::vector<float> in(n), out(n, -1);
      for (size_t i = 0; i < n; ++i) in[i] = (r + 1) * static_cast<float>(i % 7);
      result[r].first = f.of(r / 2).AllReduce({.run = run, .node = 0, .op = 0}, devices, r,
                                              in.data(), out.data(), n * 4, 4, reduce,
                                              algorithm);
      bool right = true;
      for (size_t i = 0; i < n; ++i) right = right && out[i] == total * (i % 7);
      result[r].second = right;
    });
  }
  for (auto& t : shards) t.join();
  return result;
}

// Reduce-scatter + all-gather between processes gives the same sums as the broadcast, with
// about half the bytes at four processes (2 (P-1)/P of the buffer per process instead of P-1).
TEST(CollectivesTest, ScatteredAllReduceMatchesTheBroadcastWithFewerBytes) {
  const size_t n = 3 * (Collectives::kPieceBytes / 4) + 5;  // Several pieces, uneven chunks.
  int64_t bytes[2];
  for (auto algorithm : {Collectives::Algorithm::kAuto, Collectives::Algorithm::kBroadcast}) {
    FakeProcesses f(4);
    for (int64_t run = 1; run <= 2; ++run) {
      for (auto& [status, right] : SumEverywhere(f, 4, n, run, algorithm)) {
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_TRUE(right);
      }
    }
    bytes[algorithm == Collectives::Algorithm::kAuto] = f.bytes_sent();
    for (int p = 0; p < 4; ++p) EXPECT_EQ(f.of(p).pending(), 0u);
  }
  // Per run: broadcast 4 processes x 3 peers x 2 inputs; scattered 4 x 2 phases x 3/4 buffer.
  EXPECT_EQ(bytes[0], 2 * 4 * 3 * 2 * static_cast<int64_t>(n * 4));
  EXPECT_EQ(bytes[1] * 4, bytes[0]);
}

// A peer process that never sends: every shard's wait ends after the timeout, with an error
// naming the collective and what it waited for, instead of hanging.
TEST(CollectivesTest, AStalledPeerProcessEndsTheWaitAfterTheTimeout) {
  for (size_t n : {size_t{16}, Collectives::kScatterMinBytes}) {  // Broadcast, then scattered.
    FakeProcesses f(3);
    for (int p = 0; p < 3; ++p) f.of(p).SetTimeout(absl::Milliseconds(200));
    f.Silence(2);
    auto result = SumEverywhere(f, 3, n, 1);
    for (int r = 0; r < 4; ++r) {  // Processes 0 and 1 wait for process 2.
      EXPECT_EQ(result[r].first.code(), absl::StatusCode::kDeadlineExceeded) << result[r].first;
      EXPECT_NE(result[r].first.message().find("collective run 1 node 0 op 0: waited 200ms"),
                std::string::npos) << result[r].first;
    }
  }
}

}  // namespace
}  // namespace pw
