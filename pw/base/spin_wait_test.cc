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
  Promise<> a_done, b_done;
  Future<> a_finished = a_done.future(), b_finished = b_done.future();
  std::thread a([&, done = std::move(a_done)]() mutable {
    for (uint32_t i = 0; i < kRounds; ++i) {
      ping.store(i + 1, std::memory_order_seq_cst);
      WakeAll(ping, ping_sleepers);
      SpinThenWait(pong, i, pong_sleepers, /*yields=*/i % 2 == 0 ? 0 : kSpinYields);
    }
    done.Set();
  });
  std::thread b([&, done = std::move(b_done)]() mutable {
    for (uint32_t i = 0; i < kRounds; ++i) {
      SpinThenWait(ping, i, ping_sleepers, /*yields=*/0);
      pong.store(i + 1, std::memory_order_seq_cst);
      WakeAll(pong, pong_sleepers);
    }
    done.Set();
  });
  // A lost wake leaves a thread asleep: fail instead of hanging (a guard, not a timing goal).
  const bool finished =
      a_finished.AwaitFor(absl::Seconds(60)) && b_finished.AwaitFor(absl::Seconds(60));
  EXPECT_TRUE(finished) << "a wake was lost";
  if (!finished) {  // Words no wait can match: both run to the end.
    ping.store(kRounds + 1, std::memory_order_seq_cst);
    pong.store(kRounds + 1, std::memory_order_seq_cst);
    WakeAll(ping, ping_sleepers);
    WakeAll(pong, pong_sleepers);
  }
  a.join();
  b.join();
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

// SpinYieldUntil looks at its predicate before each yield and once after the last, then gives
// up (the caller sleeps instead); a predicate that comes true within the bound ends it there.
TEST(SpinWaitTest, SpinYieldUntilGivesUpAfterItsBound) {
  int looks = 0;
  EXPECT_FALSE(SpinYieldUntil([&] {
    ++looks;
    return false;
  }));
  EXPECT_EQ(looks, kYieldsUntil + 1);

  looks = 0;
  EXPECT_TRUE(SpinYieldUntil([&] { return ++looks == 3; }));
  EXPECT_EQ(looks, 3);
}

}  // namespace
}  // namespace pw
