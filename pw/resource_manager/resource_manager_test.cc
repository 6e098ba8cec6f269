#include "pw/resource_manager/resource_manager.h"

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

ResourceManager Make(int islands, int hosts, int devs) {
  return ResourceManager(*ClusterSpec::Uniform(islands, hosts, devs, 1 << 20));
}

TEST(ResourceManagerTest, PacksASliceOntoFewHostsAndSpreadsSlicesAcrossIslands) {
  auto rm = Make(2, 2, 2);  // 8 devices: island0 = 0..3 (hosts 0,1), island1 = 4..7.
  ClientId c(1);
  auto a = rm.AllocateSlice(c, {.num_devices = 2});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->islands.size(), 1u);
  EXPECT_EQ(a->hosts[0], a->hosts[1]) << "two idle devices of one host: one dispatch, no DCN";
  auto b = rm.AllocateSlice(c, {.num_devices = 2});
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->islands[0], b->islands[0]) << "second slice should go to the idle island";
  auto third = rm.AllocateSlice(c, {.num_devices = 2});
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->islands, a->islands);
  EXPECT_EQ(third->hosts[0], third->hosts[1]) << "the idle host of the first island";
  EXPECT_NE(third->hosts[0], a->hosts[0]);
  // Where load leaves no idle host, the least-loaded devices come first, hosts after.
  auto four = rm.AllocateSlice(c, {.num_devices = 4, .islands = {a->islands[0]}});
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(absl::flat_hash_set<HostId>(four->hosts.begin(), four->hosts.end()).size(), 2u);
  EXPECT_FALSE(rm.AllocateSlice(c, {.num_devices = 8}).ok());  // One island by default.
  auto whole = rm.AllocateSlice(c, {.num_devices = 8, .placement = SlicePlacement::kSpread});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->islands.size(), 2u);
}

TEST(ResourceManagerTest, PlacementOnOneHostOneIslandOrSpread) {
  auto rm = Make(2, 2, 2);  // island0 = hosts 0,1 (devices 0..3), island1 = hosts 2,3.
  ClientId c(1);
  auto host = rm.AllocateSlice(c, {.num_devices = 2, .placement = SlicePlacement::kHost});
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->hosts[0], host->hosts[1]);
  auto next = rm.AllocateSlice(c, {.num_devices = 2, .placement = SlicePlacement::kHost});
  ASSERT_TRUE(next.ok());
  EXPECT_NE(next->hosts[0], host->hosts[0]) << "the least-loaded host";
  auto big = rm.AllocateSlice(c, {.num_devices = 3, .placement = SlicePlacement::kHost});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("largest host has 2"), std::string::npos) << big.status();
  auto island = rm.AllocateSlice(c, {.num_devices = 4});
  ASSERT_TRUE(island.ok());
  EXPECT_EQ(island->islands.size(), 1u);
  EXPECT_EQ(absl::flat_hash_set<HostId>(island->hosts.begin(), island->hosts.end()).size(), 2u);
  auto refused = rm.AllocateSlice(c, {.num_devices = 5});
  EXPECT_NE(refused.status().message().find("placement 'spread'"), std::string::npos);
  // Spread puts distinct hosts before load.
  auto spread = rm.AllocateSlice(c, {.num_devices = 2, .placement = SlicePlacement::kSpread});
  ASSERT_TRUE(spread.ok());
  EXPECT_NE(spread->hosts[0], spread->hosts[1]);
  EXPECT_EQ(SlicePlacementName(SlicePlacement::kSpread), "spread");
}

TEST(ResourceManagerTest, SlicesLieOnlyOnTheIslandsAndHostsAskedForAndAvoidOthers) {
  auto rm = Make(2, 2, 2);  // island0 = hosts 0,1 (devices 0..3), island1 = hosts 2,3.
  ClientId c(1);
  auto in1 = rm.AllocateSlice(c, {.num_devices = 2, .islands = {IslandId(1)}});
  ASSERT_TRUE(in1.ok()) << in1.status();
  EXPECT_EQ(in1->islands, std::vector<IslandId>{IslandId(1)});
  // The least-loaded island would be island 0 now; asking for island 1 still gives island 1.
  auto again = rm.AllocateSlice(c, {.num_devices = 2, .islands = {IslandId(1)}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->islands, std::vector<IslandId>{IslandId(1)});
  auto on3 = rm.AllocateSlice(c, {.num_devices = 2, .hosts = {HostId(3)}});
  ASSERT_TRUE(on3.ok()) << on3.status();
  EXPECT_EQ(on3->hosts, (std::vector<HostId>{HostId(3), HostId(3)}));
  auto elsewhere = rm.AllocateSlice(c, {.num_devices = 4, .avoid_islands = in1->islands});
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  EXPECT_EQ(elsewhere->islands, std::vector<IslandId>{IslandId(0)});
  // Hosts 1 and 2 lie in different islands: two devices on them fit only when spread.
  auto split = rm.AllocateSlice(c, {.num_devices = 4, .hosts = {HostId(1), HostId(2)}});
  EXPECT_EQ(split.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(split.status().message(), HasSubstr("on hosts [1, 2]")) << split.status();
  auto spread = rm.AllocateSlice(c, {.num_devices = 4, .placement = SlicePlacement::kSpread,
                                     .hosts = {HostId(1), HostId(2)}});
  ASSERT_TRUE(spread.ok()) << spread.status();
  EXPECT_EQ(absl::flat_hash_set<HostId>(spread->hosts.begin(), spread->hosts.end()),
            (absl::flat_hash_set<HostId>{HostId(1), HostId(2)}));
  auto nowhere = rm.AllocateSlice(c, {.num_devices = 1, .islands = {IslandId(0)},
                                      .avoid_islands = {IslandId(0)}});
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(nowhere.status().message(),
              HasSubstr("1 devices in islands [0] avoiding islands [0], but only 0 alive"));
  auto missing = rm.AllocateSlice(c, {.num_devices = 1, .islands = {IslandId(7)}});
  EXPECT_THAT(missing.status().message(), HasSubstr("in islands [7], but only 0")) << missing.status();
}

TEST(ResourceManagerTest, RefusesImpossibleRequests) {
  auto rm = Make(2, 1, 2);
  ClientId c(1);
  EXPECT_EQ(rm.AllocateSlice(c, {.num_devices = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rm.AllocateSlice(c, {.num_devices = 5}).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto e = rm.AllocateSlice(c, {.num_devices = 3});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(e.status().message().find("largest island has 2"), std::string::npos);
  EXPECT_FALSE(rm.AllocateSlice(c, {.num_devices = 4, .mesh_shape = {3, 2}}).ok());
  EXPECT_FALSE(
      rm.AllocateSlice(c, {.num_devices = 2, .mesh_shape = {3, 6148914691236517206}}).ok());
  auto m = rm.AllocateSlice(
      c, {.num_devices = 4, .mesh_shape = {2, 2}, .placement = SlicePlacement::kSpread});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->mesh_shape, (std::vector<int64_t>{2, 2}));
}

TEST(ResourceManagerTest, OwnershipAndRelease) {
  auto rm = Make(1, 1, 2);
  auto s = rm.AllocateSlice(ClientId(1), {.num_devices = 1});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(rm.ResolveSlice(ClientId(2), s->id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(rm.ReleaseSlice(ClientId(2), s->id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(rm.ReleaseSlice(ClientId(1), s->id).ok());
  EXPECT_EQ(rm.ResolveSlice(ClientId(1), s->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rm.ReleaseSlice(ClientId(1), s->id).code(), absl::StatusCode::kNotFound);
}

TEST(ResourceManagerTest, AddAndRemoveDevicesAtRunTime) {
  auto rm = Make(1, 1, 2);
  ClientId c(1);
  auto s = rm.AllocateSlice(c, {.num_devices = 2});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(rm.RemoveDevice(DeviceId(1), "test removal").ok());
  auto r = rm.ResolveSlice(c, s->id);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("device:1"), std::string::npos);
  EXPECT_FALSE(rm.AllocateSlice(c, {.num_devices = 2}).ok());
  auto host = rm.AddHost(IslandId(0), "late", 2, 1 << 20);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->devices[0].id, DeviceId(2));
  auto s2 = rm.AllocateSlice(c, {.num_devices = 3});
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_EQ(s2->devices, (std::vector<DeviceId>{DeviceId(0), DeviceId(2), DeviceId(3)}));
  EXPECT_FALSE(rm.RemoveDevice(DeviceId(99), "x").ok());
  EXPECT_FALSE(rm.AddHost(IslandId(5), "bad", 1, 1).ok());
}

}  // namespace
}  // namespace pw
