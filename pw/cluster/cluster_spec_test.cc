#include "pw/cluster/cluster_spec.h"

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(ClusterSpecTest, UniformAssignsDenseIds) {
  auto spec = ClusterSpec::Uniform(2, 2, 3, 1024);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->islands().size(), 2u);
  EXPECT_EQ(spec->hosts().size(), 4u);
  ASSERT_EQ(spec->devices().size(), 12u);
  EXPECT_EQ(spec->device(DeviceId(7)).host, HostId(2));
  EXPECT_EQ(spec->device(DeviceId(7)).island, IslandId(1));
  EXPECT_EQ(spec->device(DeviceId(7)).index_on_host, 1);
}

TEST(ClusterSpecTest, JsonRoundTrip) {
  auto spec = ClusterSpec::FromJson(R"({"device_memory_bytes": 4096, "islands": [
      {"name": "a", "hosts": [{"devices": 2}, {"devices": 1, "device_memory_bytes": 99}]},
      {"hosts": [{"name": "solo", "devices": 4}]}]})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices().size(), 7u);
  EXPECT_EQ(spec->device(DeviceId(2)).memory_bytes, 99);
  EXPECT_EQ(spec->device(DeviceId(0)).memory_bytes, 4096);
  EXPECT_EQ(spec->host(HostId(2)).name, "solo");
  auto again = ClusterSpec::FromJson(spec->ToJson());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->devices().size(), 7u);
}

TEST(ClusterSpecTest, BadSpecsNameTheProblem) {
  auto e1 = ClusterSpec::FromJson("{not json");
  EXPECT_EQ(e1.status().code(), absl::StatusCode::kInvalidArgument);
  auto e2 = ClusterSpec::FromJson(R"({"islands": [{"hosts": [{"devices": 0}]}]})");
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("islands[0].hosts[0]"), std::string::npos);
  EXPECT_FALSE(ClusterSpec::FromJson(R"({"islands": []})").ok());
  // Found by cluster_spec_fuzz: a name that is not a string threw out of the parser (aborting
  // pw up / pw controller).
  auto e3 = ClusterSpec::FromJson(R"({"islands": [{"name": 6666, "hosts": [{"devices": 2}]}]})");
  EXPECT_EQ(e3.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e3.status().message().find("islands[0].name must be a string"), std::string::npos);
  auto e4 = ClusterSpec::FromJson(R"({"islands": [{"hosts": [{"devices": 2, "name": [1]}]}]})");
  EXPECT_NE(e4.status().message().find("islands[0].hosts[0].name must be a string"),
            std::string::npos) << e4.status();
  EXPECT_FALSE(ClusterSpec::Uniform(0, 1, 1).ok());
  EXPECT_EQ(ClusterSpec::FromFile("/nonexistent.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pw
