#include "pw/executor/device_memory.h"

#include <barrier>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(DeviceMemoryTest, GrantsImmediatelyWhenItFits) {
  DeviceMemory mem(DeviceId(0), 100);
  auto a = mem.Reserve(60);
  ASSERT_TRUE(a.IsReady());
  EXPECT_EQ(mem.in_use(), 60);
  a = Future<ReservationRef>();  // drop
}

TEST(DeviceMemoryTest, BackPressureWaitsInFifoOrder) {
  DeviceMemory mem(DeviceId(0), 100);
  ReservationRef a = *mem.Reserve(80).Await();
  auto b = mem.Reserve(50);
  auto c = mem.Reserve(10);  // Fits, but must not overtake b.
  EXPECT_FALSE(b.IsReady());
  EXPECT_FALSE(c.IsReady());
  EXPECT_EQ(mem.waiting(), 2u);
  a.reset();
  ASSERT_TRUE(b.IsReady());
  ASSERT_TRUE(c.IsReady());
  EXPECT_EQ(mem.in_use(), 60);
  EXPECT_EQ(mem.peak_in_use(), 80);
}

TEST(DeviceMemoryTest, NeverFitsFailsAtOnce) {
  DeviceMemory mem(DeviceId(3), 100);
  auto r = mem.Reserve(101);
  ASSERT_TRUE(r.IsReady());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("device:3"), std::string::npos);
}

TEST(DeviceMemoryTest, CloseFailsWaiters) {
  DeviceMemory mem(DeviceId(0), 10);
  ReservationRef a = *mem.Reserve(10).Await();
  auto b = mem.Reserve(5);
  mem.Close(absl::UnavailableError("device:0 removed"));
  ASSERT_TRUE(b.IsReady());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(mem.Reserve(1).status().ok());
}

TEST(DeviceMemoryTest, TryReserveGrantsOnlyWhatFitsNowWithNoneWaiting) {
  DeviceMemory mem(DeviceId(0), 100);
  ReservationRef a = mem.TryReserve(60);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->bytes(), 60);
  EXPECT_EQ(mem.in_use(), 60);
  EXPECT_EQ(mem.TryReserve(41), nullptr);  // Does not fit.
  EXPECT_EQ(mem.TryReserve(-1), nullptr);
  auto waiting = mem.Reserve(50);
  EXPECT_FALSE(waiting.IsReady());
  EXPECT_EQ(mem.TryReserve(10), nullptr);  // Fits, but must not overtake the waiter.
  a.reset();
  ASSERT_TRUE(waiting.IsReady());
  EXPECT_EQ(mem.in_use(), 50);
  ReservationRef b = mem.TryReserve(50);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(mem.in_use(), 100);
  b.reset();
  EXPECT_EQ(mem.in_use(), 50);
  mem.Close(absl::UnavailableError("device:0 removed"));
  EXPECT_EQ(mem.TryReserve(1), nullptr);
}

// Grants and releases race (no lock on the fast path): no request is stranded waiting for
// bytes already released, and the budget is never exceeded.
TEST(DeviceMemoryTest, ConcurrentReservesAndReleasesNeverStrandAWaiter) {
  DeviceMemory mem(DeviceId(0), 100);
  std::vector<std::thread> threads;
  std::atomic<int> stranded{0}, waited{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        const int64_t bytes = 20 + (i * 7 + t * 13) % 41;  // Two may not fit together.
        ReservationRef r = mem.TryReserve(bytes);
        if (r == nullptr) {
          waited.fetch_add(1);
          Future<ReservationRef> f = mem.Reserve(bytes);
          if (!f.AwaitFor(absl::Seconds(30))) {
            stranded.fetch_add(1);
            return;
          }
          r = *f.Await();
        }
        ASSERT_EQ(r->bytes(), bytes);
        std::this_thread::yield();  // Held while the others run.
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(stranded.load(), 0);
  EXPECT_GT(waited.load(), 0);
  EXPECT_EQ(mem.in_use(), 0);
  EXPECT_EQ(mem.waiting(), 0u);
  EXPECT_LE(mem.peak_in_use(), 100);
}

// The last release races a request that finds the budget full: the request is granted once
// the bytes are free, though no later release comes to grant it.
TEST(DeviceMemoryTest, RequestRacingTheLastReleaseIsGranted) {
  DeviceMemory mem(DeviceId(0), 100);
  constexpr int kRounds = 50000;
  std::barrier sync(2);
  std::vector<ReservationRef> full(kRounds);
  int stranded = 0;
  std::thread releaser([&] {
    for (int i = 0; i < kRounds; ++i) {
      sync.arrive_and_wait();
      full[i].reset();
      sync.arrive_and_wait();
    }
  });
  for (int i = 0; i < kRounds; ++i) {
    if (stranded == 0) full[i] = mem.TryReserve(100);  // Null once a request is stranded.
    const bool full_now = full[i] != nullptr;  // Read before the releaser may reset it.
    sync.arrive_and_wait();
    Future<ReservationRef> f;
    if (full_now) f = mem.Reserve(60);  // Races the release of `full[i]`.
    sync.arrive_and_wait();
    if (f.valid() && !f.AwaitFor(absl::Seconds(10))) ++stranded;
  }
  releaser.join();
  EXPECT_EQ(stranded, 0);
  EXPECT_EQ(mem.in_use(), 0);
}

}  // namespace
}  // namespace pw
