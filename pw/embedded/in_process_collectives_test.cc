#include "pw/embedded/in_process_collectives.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/base/mutex.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

// `n` hosts with devices 2h and 2h + 1, host h on island h / 2, each with its end of the
// transport; a host can be taken out of the directory (its worker failed).
class Hosts {
 public:
  explicit Hosts(int n, absl::Duration timeout = absl::Seconds(30)) {
    for (int h = 0; h < n; ++h) {
      ends_.push_back(std::make_shared<InProcessCollectivePeers>(
          HostId(h), IslandId(h / 2), std::vector<DeviceId>{DeviceId(2 * h), DeviceId(2 * h + 1)},
          [n](DeviceId d) -> absl::StatusOr<DeviceSpec> {
            if (d.value() >= 2 * n) return absl::NotFoundError(d.ToString());
            const int64_t h = d.value() / 2;
            return DeviceSpec{d, HostId(h), IslandId(h / 2)};
          },
          [this](HostId h) -> std::shared_ptr<InProcessCollectivePeers> {
            pw::MutexLock lock(&mu_);
            if (gone_.contains(h)) return nullptr;
            return ends_[h.value()];
          },
          timeout));
    }
  }
  Collectives& of(int h) { return ends_[h]->collectives(); }
  InProcessCollectivePeers& end(int h) { return *ends_[h]; }
  void Remove(int h) {
    pw::MutexLock lock(&mu_);
    gone_.insert(HostId(h));
  }

 private:
  std::vector<std::shared_ptr<InProcessCollectivePeers>> ends_;
  pw::Mutex mu_;
  absl::flat_hash_set<HostId> gone_ ABSL_GUARDED_BY(mu_);
};

struct Shard {
  absl::Status status;
  bool right = false;
};

// A float sum AllReduce of `n` elements over the devices of `hosts` (2 each), each shard on the
// Collectives of its host; rank r's input is (r + 1) * (i % 7).
std::vector<Shard> SumOver(Hosts& all, const std::vector<int>& hosts, size_t n, int64_t run) {
  std::vector<DeviceId> devices;
  for (int h : hosts) devices.insert(devices.end(), {DeviceId(2 * h), DeviceId(2 * h + 1)});
  auto reduce = [](void* acc, const void* x, size_t bytes) {
    for (size_t i = 0; i < bytes / 4; ++i)
      static_cast<float*>(acc)[i] += static_cast<const float*>(x)[i];
  };
  float total = 0;
  for (size_t r = 0; r < devices.size(); ++r) total += r + 1;
  std::vector<Shard> result(devices.size());
  std::vector<std::thread> shards;
  for (size_t r = 0; r < devices.size(); ++r) {
    shards.emplace_back([&, r] {
      std::vector<float> in(n), out(n, -1);
      for (size_t i = 0; i < n; ++i) in[i] = (r + 1) * static_cast<float>(i % 7);
      result[r].status = all.of(hosts[r / 2]).AllReduce({.run = run, .node = 0, .op = 0}, devices,
                                                        static_cast<int>(r), in.data(),
                                                        out.data(), n * 4, 4, reduce);
      result[r].right = true;
      for (size_t i = 0; i < n; ++i) result[r].right &= out[i] == total * (i % 7);
    });
  }
  for (auto& t : shards) t.join();
  return result;
}

// Each host meets only its own shards and exchanges the rest with the others: one round of
// inputs for small buffers, reduce-scatter then all-gather for large ones over 3 hosts.
TEST(InProcessCollectivesTest, AnAllReduceAcrossHostsSumsEveryShard) {
  Hosts all(3);
  std::vector<DeviceId> six;
  for (int d = 0; d < 6; ++d) six.push_back(DeviceId(d));
  ASSERT_EQ(all.end(0).ProcessesOf(six).count, 3);  // Three processes: the scatter applies.
  int64_t run = 0;
  for (size_t n : {size_t{5}, Collectives::kScatterMinBytes / 4 + 3}) {
    for (const Shard& s : SumOver(all, {0, 1, 2}, n, ++run)) {
      ASSERT_TRUE(s.status.ok()) << s.status;
      EXPECT_TRUE(s.right) << n << " elements";
    }
  }
  for (int h = 0; h < 3; ++h) EXPECT_EQ(all.of(h).pending(), 0u);
}

// Processes are numbered by the first rank each holds (what the scatter's chunks follow).
TEST(InProcessCollectivesTest, HostsAreNumberedByTheirFirstRank) {
  Hosts all(3);
  const std::vector<DeviceId> devices{DeviceId(3), DeviceId(0), DeviceId(4), DeviceId(1),
                                      DeviceId(99)};  // Unknown: skipped.
  const CollectivePeers::Processes p = all.end(0).ProcessesOf(devices);
  EXPECT_EQ(p.count, 3);
  EXPECT_EQ(p.self, 1);
  EXPECT_TRUE(all.end(1).IsLocal(DeviceId(3)));
  EXPECT_FALSE(all.end(1).IsLocal(DeviceId(4)));
}

// A host that has no live worker fails the launch on the hosts that would send to it, naming
// it, and they tell the other hosts, whose shards do not wait for the timeout: inputs sent in
// one round, and the reduce-scatter's pieces.
TEST(InProcessCollectivesTest, AHostWithoutAWorkerFailsTheLaunchEverywhere) {
  Hosts all(3, absl::Seconds(20));  // A wait that does not end fails.
  all.Remove(2);
  // Hosts 0 and 1 meet with host 2's devices in the slice; host 2's shards never come.
  std::vector<DeviceId> devices;
  for (int d = 0; d < 6; ++d) devices.push_back(DeviceId(d));
  int64_t run = 0;
  for (size_t n : {size_t{1}, Collectives::kScatterMinBytes / 4}) {
    ++run;
    std::vector<absl::Status> status(4);
    std::vector<std::thread> shards;
    for (int r = 0; r < 4; ++r) {
      shards.emplace_back([&, r] {
        std::vector<float> in(n, 1), out(n);
        status[r] = all.of(r / 2).AllReduce(
            {.run = run, .node = 3, .op = 0}, devices, r, in.data(), out.data(), n * 4, 4,
            [](void* acc, const void* x, size_t bytes) {
              for (size_t i = 0; i < bytes / 4; ++i)
                static_cast<float*>(acc)[i] += static_cast<const float*>(x)[i];
            });
      });
    }
    for (auto& t : shards) t.join();
    for (const absl::Status& s : status) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << n << " elements: " << s;
      EXPECT_THAT(s.message(), HasSubstr("host:2 has no live worker"));
    }
  }
}

// A launch that fails on one host (a shard's input failed) reaches the shards waiting on another.
TEST(InProcessCollectivesTest, ALaunchFailedOnOneHostEndsTheOthersWait) {
  Hosts all(2, absl::Seconds(20));
  const std::vector<DeviceId> devices{DeviceId(0), DeviceId(1), DeviceId(2), DeviceId(3)};
  std::vector<absl::Status> status(2);
  std::vector<std::thread> shards;
  for (int r = 2; r < 4; ++r) {  // Host 1's shards.
    shards.emplace_back([&, r] {
      float in = 1, out = 0;
      status[r - 2] = all.of(1).Run({.run = 5, .node = 0, .op = 0}, devices, r, &in, 4, &out, 4,
                                    [](auto, auto) { return absl::OkStatus(); });
    });
  }
  all.of(0).FailLaunch(5, 0, absl::InternalError("shard 0's input failed"), devices);
  for (auto& t : shards) t.join();
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(s.message(), HasSubstr("shard 0's input failed"));
  }
}

}  // namespace
}  // namespace pw
