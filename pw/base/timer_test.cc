#include "pw/base/timer.h"

#include <vector>

#include "gtest/gtest.h"
#include "pw/base/future.h"

namespace pw {
namespace {

TEST(TimerTest, RunsClosuresInDeadlineOrderAndCancelledOnesNever) {
  Timer t("pw-test-timer");
  pw::Mutex mu;
  std::vector<int> order;
  Promise<> last;
  Future<> done = last.future();
  const absl::Time now = absl::Now();
  auto record = [&](int i) {
    pw::MutexLock lock(&mu);
    order.push_back(i);
  };
  // The first closure holds the timer's thread until everything is scheduled, so the order
  // below is the deadlines' whatever the test thread's delays (a slow machine once ran a
  // closure due in 10 ms before the test had scheduled the rest).
  Promise<> open;
  t.Schedule(now - absl::Seconds(1), [gate = open.future()] { (void)gate.Await(); });
  t.Schedule(now + absl::Milliseconds(30), [&] { record(3); });
  const Timer::Id cancelled = t.Schedule(now + absl::Milliseconds(20), [&] { record(99); });
  t.Schedule(now + absl::Milliseconds(10), [&] { record(1); });
  t.Schedule(now - absl::Seconds(1), [&] { record(0); });  // Past: at once (after the gate).
  t.Schedule(now + absl::Milliseconds(40), [&, p = std::move(last)]() mutable {
    record(4);
    p.Set();
  });
  EXPECT_TRUE(t.Cancel(cancelled));
  EXPECT_FALSE(t.Cancel(cancelled));
  open.Set();
  ASSERT_TRUE(done.AwaitFor(absl::Seconds(60)));  // Deadlock guard, not a timing goal.
  pw::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 3, 4}));
  EXPECT_EQ(t.size(), 0u);
}

TEST(TimerTest, AnEarlierDeadlineScheduledLaterWakesTheTimer) {
  Timer t("pw-test-timer");
  Promise<> p;
  Future<> f = p.future();
  t.Schedule(absl::Now() + absl::Hours(1), [] {});
  t.Schedule(absl::Now(), [p = std::move(p)]() mutable { p.Set(); });
  EXPECT_TRUE(f.AwaitFor(absl::Seconds(60)));
  EXPECT_EQ(t.size(), 1u);  // The hour-long one waits; the destructor drops it.
}

}  // namespace
}  // namespace pw
