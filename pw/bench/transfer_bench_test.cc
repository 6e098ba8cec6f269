#include "pw/bench/transfer_bench.h"

#include "gtest/gtest.h"
#include "pw/embedded/embedded_cluster.h"

namespace pw {
namespace {

std::unique_ptr<EmbeddedCluster> Cluster(int islands, int hosts_per_island) {
  auto spec = ClusterSpec::Uniform(islands, hosts_per_island, 1);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto c = EmbeddedCluster::Create(*spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

TEST(TransferBenchOnTest, MovesBetweenHostsAndCountsEachLink) {
  auto cluster = Cluster(2, 2);
  TransferBenchOptions o{.sizes = {4096, 1 << 20}, .min_seconds = 0.01, .rounds = 2,
                         .min_iterations = 2};
  const LinkBytes before = ReceivedBytes(cluster->controller()).value();
  auto r = RunTransferBenchOn(&cluster->controller(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  const LinkBytes after = ReceivedBytes(cluster->controller()).value();
  ASSERT_EQ(r->size(), 4u);  // ICI and DCN for each size.
  int64_t ici_moved = 0, dcn_moved = 0;
  for (const auto& x : *r) {
    (x.path == "ici" ? ici_moved : dcn_moved) += x.moved_bytes;
    SCOPED_TRACE(x.path + " " + std::to_string(x.bytes));
    EXPECT_EQ(x.baseline, "resident");
    EXPECT_GT(x.pathways_bytes_per_second, 0);
    // Warm-up plus at least min_iterations per round, each moving the whole array.
    EXPECT_GE(x.moved_bytes, x.bytes * (1 + o.rounds * o.min_iterations));
    // The workers counted exactly those bytes on this path's link.
    EXPECT_EQ(x.counted_bytes, x.moved_bytes);
  }
  // And nothing on the other link: each link's counter grew by its own path's bytes alone.
  EXPECT_EQ(after.ici - before.ici, ici_moved);
  EXPECT_EQ(after.dcn - before.dcn, dcn_moved);
  EXPECT_EQ((*r)[0].path, "ici");
  EXPECT_EQ((*r)[1].path, "dcn");
}

TEST(TransferBenchOnTest, OneIslandMeasuresIciOnly) {
  auto cluster = Cluster(1, 2);
  auto r = RunTransferBenchOn(&cluster->controller(), {.sizes = {1024}, .min_seconds = 0});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].path, "ici");
  EXPECT_EQ((*r)[0].counted_bytes, (*r)[0].moved_bytes);
}

TEST(TransferBenchOnTest, RejectsOneHostAndBadSizes) {
  auto one = Cluster(1, 1);
  auto r = RunTransferBenchOn(&one->controller(), {.sizes = {1024}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  auto two = Cluster(2, 1);
  r = RunTransferBenchOn(&two->controller(), {.sizes = {1023}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("1023"), std::string::npos);
}

}  // namespace
}  // namespace pw
