#include "pw/executor/device.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(DeviceTest, RunsInOrderAfterDeps) {
  Device dev(DeviceId(0), HostId(0), IslandId(0), 1 << 20);
  std::vector<int> order;
  Promise<> gate;
  Promise<> done;
  Future<> done_f = done.future();
  dev.Enqueue({gate.future()}, [&](const absl::Status& s) { order.push_back(1); });
  dev.Enqueue({}, [&](const absl::Status& s) { order.push_back(2); });
  dev.Enqueue({}, [&, done = std::move(done)](const absl::Status& s) mutable {
    order.push_back(3);
    done.Set();
  });
  EXPECT_EQ(dev.queue_depth(), 3u);
  gate.Set();
  ASSERT_TRUE(done_f.status().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(DeviceTest, DependencyErrorReachesWork) {
  Device dev(DeviceId(0), HostId(0), IslandId(0), 1 << 20);
  Promise<absl::Status> seen;
  auto f = seen.future();
  dev.Enqueue({Future<>::Ready(absl::DataLossError("input gone"))},
              [p = std::move(seen)](const absl::Status& s) mutable { p.Set(s); });
  EXPECT_EQ(f.Await()->code(), absl::StatusCode::kDataLoss);
}

TEST(DeviceTest, RemoveFailsQueuedAndLaterWork) {
  Device dev(DeviceId(5), HostId(0), IslandId(0), 1 << 20);
  Promise<> gate;
  std::atomic<int> failed{0};
  Promise<> first_done;
  auto first = first_done.future();
  dev.Enqueue({gate.future()}, [&, p = std::move(first_done)](const absl::Status& s) mutable {
    if (!s.ok()) failed++;
    p.Set();
  });
  dev.Remove(absl::UnavailableError("device:5 removed"));
  gate.Set();
  first.status().IgnoreError();
  absl::Status later;
  dev.Enqueue({}, [&](const absl::Status& s) { later = s; });
  EXPECT_EQ(failed.load(), 1);
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(dev.health().ok());
}

}  // namespace
}  // namespace pw
