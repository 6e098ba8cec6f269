#include "pw/dataplane/shm_mailbox.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pw/base/mutex.h"
#include "gtest/gtest.h"

namespace pw::dataplane {
namespace {

struct Received {
  pw::Mutex mu;
  std::vector<std::string> messages ABSL_GUARDED_BY(mu);
  void Add(absl::string_view m) {
    pw::MutexLock l(&mu);
    messages.emplace_back(m);
  }
  bool WaitFor(size_t n) {
    const bool ok = mu.LockWhenWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return messages.size() >= n; }, absl::Seconds(30));
    mu.Unlock();
    return ok;
  }
};

TEST(ShmMailboxTest, ProducersInOtherMappingsDeliverEveryMessageInOrderPerProducer) {
  Received got;
  auto box = ShmMailbox::Create([&](absl::string_view m) { got.Add(m); }, 1 << 12);
  ASSERT_TRUE(box.ok()) << box.status();
  constexpr int kProducers = 3, kEach = 2000;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      auto out = ShmMailbox::Open((*box)->name());  // Its own mapping, as another process has.
      ASSERT_TRUE(out.ok()) << out.status();
      for (int i = 0; i < kEach; ++i) {
        const std::string m = absl::StrCat(p, ":", i);
        while (absl::IsResourceExhausted((*out)->Send(m))) std::this_thread::yield();  // Full.
      }
    });
  }
  for (auto& t : producers) t.join();
  ASSERT_TRUE(got.WaitFor(kProducers * kEach));
  pw::MutexLock l(&got.mu);
  std::vector<int> next(kProducers, 0);
  for (const std::string& m : got.messages) {
    const int p = m[0] - '0';
    EXPECT_EQ(m, absl::StrCat(p, ":", next[p]));
    ++next[p];
  }
  EXPECT_EQ(next, std::vector<int>(kProducers, kEach));
}

// Threads of the owner that poll race the receiver thread: every message is handed on once, in
// order; after StopDelivering nothing is, and producers' Poll hands on nothing.
TEST(ShmMailboxTest, PollersAndTheReceiverHandOnEachMessageOnceInOrder) {
  Received got;
  std::atomic<bool> stopped{false};
  std::atomic<int> after_stop{0};
  auto box = ShmMailbox::Create(
      [&](absl::string_view m) {
        if (stopped) ++after_stop;
        got.Add(m);
      },
      1 << 12);
  ASSERT_TRUE(box.ok()) << box.status();
  auto out = ShmMailbox::Open((*box)->name());
  ASSERT_TRUE(out.ok()) << out.status();
  constexpr int kEach = 5000;
  std::atomic<bool> sending{true};
  std::atomic<int> polled{0};
  std::vector<std::thread> pollers;
  for (int t = 0; t < 2; ++t) {
    pollers.emplace_back([&] {
      while (sending) polled += (*box)->Poll();
    });
  }
  for (int i = 0; i < kEach; ++i) {
    while (absl::IsResourceExhausted((*out)->Send(absl::StrCat(i)))) std::this_thread::yield();
  }
  ASSERT_TRUE(got.WaitFor(kEach));
  sending = false;
  for (auto& t : pollers) t.join();
  EXPECT_FALSE((*out)->Poll());  // A producer's side hands nothing on.
  {
    pw::MutexLock l(&got.mu);
    ASSERT_EQ(got.messages.size(), static_cast<size_t>(kEach));
    for (int i = 0; i < kEach; ++i) EXPECT_EQ(got.messages[i], absl::StrCat(i));
  }
  (*box)->StopDelivering();
  stopped = true;
  EXPECT_TRUE((*out)->Send("after").ok());
  EXPECT_FALSE((*box)->Poll());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(after_stop, 0);
  std::printf("messages handed on by pollers: %d polls delivered\n", polled.load());
}

// The owner's key is what an opener reads, and each mailbox has its own.
TEST(ShmMailboxTest, AnOpenerReadsTheOwnersKey) {
  auto a = ShmMailbox::Create([](absl::string_view) {}, 1 << 12);
  auto b = ShmMailbox::Create([](absl::string_view) {}, 1 << 12);
  ASSERT_TRUE(a.ok() && b.ok());
  auto opened = ShmMailbox::Open((*a)->name());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->key(), (*a)->key());
  EXPECT_NE((*a)->key(), (*b)->key());
}

TEST(ShmMailboxTest, RefusesWhatDoesNotFitAndBadNames) {
  auto box = ShmMailbox::Create([](absl::string_view) {}, 1 << 10);
  ASSERT_TRUE(box.ok());
  auto out = ShmMailbox::Open((*box)->name());
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(absl::IsResourceExhausted((*out)->Send(std::string(600, 'x'))));
  EXPECT_TRUE((*out)->Send("small").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ShmMailbox::Open("/etc-passwd").status()));
  EXPECT_FALSE(ShmMailbox::Open("/pw-mbox-does-not-exist").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ShmMailbox::Create([](absl::string_view) {}, 1000).status()));
}

}  // namespace
}  // namespace pw::dataplane
