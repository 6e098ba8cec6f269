#include "pw/base/future.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(FutureTest, ReadyValueAndStatus) {
  auto f = Future<int>::Ready(7);
  ASSERT_TRUE(f.IsReady());
  EXPECT_EQ(*f.Await(), 7);
  auto e = Future<int>::Ready(absl::NotFoundError("x"));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kNotFound);
}

TEST(FutureTest, CallbackRunsOnSetterThreadOrImmediately) {
  Promise<int> p;
  Future<int> f = p.future();
  int seen = 0;
  f.OnReady([&](const absl::StatusOr<int>& v) { seen = *v; });
  EXPECT_EQ(seen, 0);
  p.Set(5);
  EXPECT_EQ(seen, 5);
  int again = 0;
  f.OnReady([&](const absl::StatusOr<int>& v) { again = *v + 1; });
  EXPECT_EQ(again, 6);
}

TEST(FutureTest, AwaitAcrossThreads) {
  Promise<> p;
  Future<> f = p.future();
  std::thread t([p = std::move(p)]() mutable { p.Set(absl::OkStatus()); });
  EXPECT_TRUE(f.status().ok());
  t.join();
}

TEST(FutureTest, TakeMovesTheValueOutOfItsLastFutureAndCopiesOtherwise) {
  using Bytes = std::vector<int>;
  Promise<Bytes> p;
  Future<Bytes> f = p.future();
  std::thread setter([p = std::move(p)]() mutable { p.Set(Bytes(1000, 7)); });
  const int* held = f.Await()->data();
  setter.join();
  Future<Bytes> copy = f;
  absl::StatusOr<Bytes> copied = std::move(f).Take();  // Another future holds it: a copy.
  ASSERT_TRUE(copied.ok());
  EXPECT_NE(copied->data(), held);
  EXPECT_EQ(copy.Await()->size(), 1000u);  // Still there for the other.
  absl::StatusOr<Bytes> moved = std::move(copy).Take();  // The last: moved, not copied.
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(moved->data(), held);
  EXPECT_EQ(*moved, Bytes(1000, 7));
}

TEST(FutureTest, AbandonedPromiseFailsFuture) {
  Future<int> f;
  {
    Promise<int> p;
    f = p.future();
  }
  ASSERT_TRUE(f.IsReady());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInternal);
}

TEST(FutureTest, AwaitForTimesOut) {
  Promise<> p;
  Future<> f = p.future();
  EXPECT_FALSE(f.AwaitFor(absl::Milliseconds(5)));
  p.Set();
  EXPECT_TRUE(f.AwaitFor(absl::Milliseconds(5)));
}

TEST(FutureTest, JoinReportsFirstErrorInArgumentOrder) {
  Promise<> a, b, c;
  Future<> j = JoinFutures({a.future(), b.future(), c.future()});
  c.Set(absl::InternalError("c"));
  a.Set();
  EXPECT_FALSE(j.IsReady());
  b.Set(absl::NotFoundError("b"));
  ASSERT_TRUE(j.IsReady());
  EXPECT_EQ(j.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(JoinFutures({}).status().ok());
}

TEST(FutureTest, JoinManyThreads) {
  std::vector<Promise<>> ps(64);
  std::vector<Future<>> fs;
  for (auto& p : ps) fs.push_back(p.future());
  Future<> j = JoinFutures(fs);
  std::vector<std::thread> ts;
  for (auto& p : ps) ts.emplace_back([p = std::move(p)]() mutable { p.Set(); });
  EXPECT_TRUE(j.status().ok());
  for (auto& t : ts) t.join();
}

TEST(FutureTest, AsStatusFuture) {
  Promise<int> p;
  Future<> s = AsStatusFuture(p.future());
  p.Set(absl::AbortedError("gone"));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace pw
