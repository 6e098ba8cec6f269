#include "pw/examples/figure2.h"

#include "gtest/gtest.h"
#include "pw/embedded/embedded_cluster.h"

namespace pw {
namespace {

void ExpectFigure2(const ClusterSpec& spec) {
  auto cluster = EmbeddedCluster::Create(spec);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto r = RunFigure2(&(*cluster)->controller());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ToString(), "(array([3., 5.]), array([2., 4.]))");
  // One node per sharded computation: Arg, a, b, c, a#2, Result, plus any transfers.
  EXPECT_NE(r->lowered.find("Compute 'a#2'"), std::string::npos) << r->lowered;
  EXPECT_NE(r->lowered.find(" Arg "), std::string::npos);
  EXPECT_NE(r->lowered.find(" Result "), std::string::npos);
}

TEST(Figure2Test, TwoIslands) { ExpectFigure2(*ClusterSpec::Uniform(2, 2, 2)); }
TEST(Figure2Test, OneHostTwoDevicesEverySliceShared) { ExpectFigure2(*ClusterSpec::Uniform(1, 1, 2)); }
TEST(Figure2Test, FromJsonSpec) {
  ExpectFigure2(*ClusterSpec::FromJson(
      R"({"islands": [{"hosts": [{"devices": 1}, {"devices": 1}]}, {"hosts": [{"devices": 3}]}]})"));
}

TEST(Figure2Test, CrossIslandTransfersAreCountedAsDcn) {
  auto cluster = *EmbeddedCluster::Create(*ClusterSpec::Uniform(2, 1, 2));
  ASSERT_TRUE(RunFigure2(&cluster->controller()).ok());
  const LinkBytes received = ReceivedBytes(cluster->controller()).value();
  // a, b, c land on islands 0, 1, 0: x moves a->b (DCN), a->c is on island 0's devices again.
  EXPECT_GT(received.dcn, 0);
  auto r = RunFigure2(&cluster->controller());
  EXPECT_NE(r->lowered.find("Transfer (dcn)"), std::string::npos) << r->lowered;
  EXPECT_GE(received.ici, 0);
}

}  // namespace
}  // namespace pw
