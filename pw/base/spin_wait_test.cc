#include "pw/base/spin_wait.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "pw/base/future.h"

namespace pw {
namespace {

// Two threads hand a token back and forth, each sleeping at once (no yields) until the other
// flips its word: a wake skipped while the other was going to sleep would hang the exchange.
TEST(SpinWaitTest, PingPongNeverLosesAWake) {
  constexpr uint32_t kRounds = 20000;
  std::atomic<uint32_t> ping{0}, pong{0}, ping_sleepers{0}, pong_sleepers{0};
  Promise<> finished;
  Future<> done = finished.future();
  std::thread other([&, finished = std::move(finished)]() mutable {
    for (uint32_t i = 0; i < kRounds; ++i) {
      SpinThenWait(ping, i, ping_sleepers, /*yields=*/0);
      pong.store(i + 1, std::memory_order_seq_cst);
      WakeAll(pong, pong_sleepers);
    }
    finished.Set();
  });
  for (uint32_t i = 0; i < kRounds; ++i) {
    ping.store(i + 1, std::memory_order_seq_cst);
    WakeAll(ping, ping_sleepers);
    SpinThenWait(pong, i, pong_sleepers, /*yields=*/i % 2 == 0 ? 0 : kSpinYields);
  }
  // A lost wake leaves `other` asleep: fail instead of hanging (a guard, not a timing goal).
  const bool finished_in_time = done.AwaitFor(absl::Seconds(60));
  EXPECT_TRUE(finished_in_time) << "a wake was lost";
  if (!finished_in_time) {
    ping.store(kRounds + 1);  // Unblock it so the test can end.
    WakeAll(ping, ping_sleepers);
  }
  other.join();
  EXPECT_EQ(ping_sleepers.load(), 0u);
  EXPECT_EQ(pong_sleepers.load(), 0u);
}

// A wait on a word that has already changed returns at once, leaving no sleeper counted.
TEST(SpinWaitTest, WaitReturnsAtOnceWhenTheWordAlreadyChanged) {
  std::atomic<uint32_t> word{1}, sleepers{0};
  SpinThenWait(word, 0, sleepers, 0);
  WakeAll(word, sleepers);
  EXPECT_EQ(sleepers.load(), 0u);
}

}  // namespace
}  // namespace pw
