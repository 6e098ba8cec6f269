#include "pw/executor/device.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(DeviceTest, RunsInOrderOneAtATime) {
  Device dev(DeviceId(0), HostId(0), IslandId(0), 1 << 20);
  std::vector<int> order;
  Promise<> gate;
  Future<> gate_f = gate.future();
  Promise<> done;
  Future<> done_f = done.future();
  // The first item blocks the device (as a stream waits on an event); the others queue behind.
  dev.Enqueue([&](const absl::Status&) {
    gate_f.status().IgnoreError();
    order.push_back(1);
  });
  dev.Enqueue([&](const absl::Status&) { order.push_back(2); });
  dev.Enqueue([&, done = std::move(done)](const absl::Status&) mutable {
    order.push_back(3);
    done.Set();
  });
  EXPECT_EQ(dev.queue_depth(), 3u);
  gate.Set();
  ASSERT_TRUE(done_f.status().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(dev.executed() >= 2, true);
}

TEST(DeviceTest, RemoveFailsQueuedAndLaterWork) {
  Device dev(DeviceId(5), HostId(0), IslandId(0), 1 << 20);
  Promise<> gate;
  Future<> gate_f = gate.future();
  std::atomic<int> failed{0};
  Promise<> second_done;
  auto second = second_done.future();
  dev.Enqueue([&](const absl::Status&) { gate_f.status().IgnoreError(); });
  dev.Enqueue([&, p = std::move(second_done)](const absl::Status& s) mutable {
    if (!s.ok()) failed++;
    p.Set();
  });
  dev.Remove(absl::UnavailableError("device:5 removed"));
  gate.Set();
  second.status().IgnoreError();
  Promise<> later_done;
  Future<> later_f = later_done.future();
  absl::Status later;
  dev.Enqueue([&, p = std::move(later_done)](const absl::Status& s) mutable {
    later = s;
    p.Set();
  });
  later_f.status().IgnoreError();  // Later work still runs on the device thread, with the error.
  EXPECT_EQ(failed.load(), 1);
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(dev.health().ok());
}

TEST(DeviceTest, RemovalReachesItemsTakenInTheSameBatch) {
  Device dev(DeviceId(6), HostId(0), IslandId(0), 1 << 20);
  Promise<> gate0, gate1, started1;
  Future<> gate0_f = gate0.future(), gate1_f = gate1.future(), started1_f = started1.future();
  std::vector<absl::Status> seen(3);
  Promise<> done;
  Future<> done_f = done.future();
  dev.Enqueue([&](const absl::Status&) { gate0_f.status().IgnoreError(); });
  // Queued while the first item runs, so the device takes these three as one batch.
  dev.Enqueue([&, p = std::move(started1)](const absl::Status& s) mutable {
    seen[0] = s;
    p.Set();
    gate1_f.status().IgnoreError();
  });
  dev.Enqueue([&](const absl::Status& s) { seen[1] = s; });
  dev.Enqueue([&](const absl::Status& s) { seen[2] = s; });
  gate0.Set();
  ASSERT_TRUE(started1_f.status().ok());
  dev.Remove(absl::UnavailableError("device:6 removed"));
  // Runs once the four before it have run and been counted.
  int64_t executed_before = -1;
  dev.Enqueue([&, p = std::move(done)](const absl::Status&) mutable {
    executed_before = dev.executed();
    p.Set();
  });
  gate1.Set();
  ASSERT_TRUE(done_f.status().ok());
  EXPECT_TRUE(seen[0].ok());
  EXPECT_EQ(seen[1].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(seen[2].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(executed_before, 4);
}

}  // namespace
}  // namespace pw

#include "pw/executor/native_function.h"

namespace pw {
namespace {

// The hazard gang scheduling exists for: two SPMD computations with collectives enqueued in
// different orders on two devices deadlock. (The island scheduler test suite shows the same
// programs complete when one scheduler orders them.)
TEST(DeviceTest, InconsistentOrderOfCollectivesDeadlocks) {
  Collectives coll;
  NativeFunctionBuilder b("ar");
  int x = b.Input({DType::kF32, Shape({1})});
  ExecutableRef exe = *CompileNative(b.Build({b.Op("all_reduce_sum", {x})}), 2);
  Device d0(DeviceId(0), HostId(0), IslandId(0), 1 << 20);
  Device d1(DeviceId(1), HostId(0), IslandId(0), 1 << 20);
  static const DeviceId kDevs[] = {DeviceId(0), DeviceId(1)};
  std::vector<Future<>> done;
  auto enqueue = [&](Device& d, int rank, int64_t run) {
    Promise<> p;
    done.push_back(p.future());
    float one = 1;
    d.Enqueue([&, rank, run, one, p = std::move(p)](const absl::Status&) mutable {
      ShardLaunch l;
      l.key = {run, 0, 0};
      l.rank = rank;
      l.slice_devices = kDevs;
      l.device = kDevs[rank];
      l.inputs = {HostDeviceBuffer::FromHost({DType::kF32, Shape({1})}, kDevs[rank], &one)};
      l.collectives = &coll;
      p.Set(exe->ExecuteShard(l).status());
    });
  };
  enqueue(d0, 0, /*run=*/1);  // device 0: run 1, then run 2
  enqueue(d0, 0, 2);
  enqueue(d1, 1, 2);          // device 1: run 2, then run 1
  enqueue(d1, 1, 1);
  EXPECT_FALSE(JoinFutures(done).AwaitFor(absl::Milliseconds(300))) << "expected a deadlock";
  // Unstick: removing a device aborts the collectives waiting on it.
  coll.AbortDevice(DeviceId(1), absl::CancelledError("test over"));
  d0.Remove(absl::CancelledError("test over"));
  d1.Remove(absl::CancelledError("test over"));
  JoinFutures(done).status().IgnoreError();
}

}  // namespace
}  // namespace pw
