#include "pw/executor/collectives.h"

#include "gtest/gtest.h"

namespace pw {
namespace {

// Inputs from other processes and failure records are dropped once their run is forgotten, and
// inputs of a forgotten run that still arrive are not kept.
TEST(CollectivesTest, ForgetRunDropsRecordsAndLateInputs) {
  Collectives c;
  c.Deliver({.run = 1, .node = 0, .op = 0}, 1, "early input of run 1");
  c.Deliver({.run = 2, .node = 0, .op = 0}, 1, "early input of run 2");
  c.FailLaunch(3, 0, absl::InternalError("a shard of run 3 failed"));
  EXPECT_EQ(c.records(), 3u);
  c.ForgetRun(1);
  c.ForgetRun(3);
  EXPECT_EQ(c.records(), 1u);  // Run 2's input: its run has not ended.
  // Stragglers of forgotten runs are dropped.
  c.Deliver({.run = 1, .node = 0, .op = 1}, 1, "late");
  c.Deliver({.run = 3, .node = 0, .op = 0}, 1, "late");
  EXPECT_EQ(c.records(), 1u);
  c.ForgetRun(2);
  EXPECT_EQ(c.records(), 0u);
  // The memory of forgotten runs is bounded: the oldest are forgotten for good.
  for (int64_t r = 10; r < 10 + static_cast<int64_t>(Collectives::kForgottenRuns); ++r)
    c.ForgetRun(r);
  c.Deliver({.run = 1, .node = 0, .op = 0}, 1, "much later");
  EXPECT_EQ(c.records(), 1u);
}

}  // namespace
}  // namespace pw
