#include "pw/executor/device_memory.h"

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

}  // namespace
}  // namespace pw
