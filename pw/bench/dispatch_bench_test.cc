#include "pw/bench/dispatch_bench.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pw {
namespace {

DispatchBenchOptions Small() {
  DispatchBenchOptions o;
  o.islands = 1;
  o.hosts = 2;
  o.devices_per_host = 2;
  o.chain = 8;
  o.min_seconds = 0;
  o.min_iterations = 2;
  o.rounds = 2;
  return o;
}

TEST(DispatchBenchTest, RunsEveryWorkloadInBothModesAndComparesThem) {
  DispatchBenchOptions o = Small();
  auto r = RunDispatchBench(o);  // Checks every workload's final values.
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 6u);
  for (const auto& x : *r) {
    EXPECT_GT(x.computations_per_second, 0) << x.workload << "/" << x.dispatch;
    EXPECT_EQ(x.round_rates.size(), 2u);
  }
  const auto s = nlohmann::json::parse(DispatchBenchJson(o, *r))["summary"];
  for (const char* key : {"chained_over_fused", "chained_over_opbyop",
                          "chained_parallel_over_sequential"}) {
    ASSERT_TRUE(s.contains(key)) << key;
    EXPECT_GT(s[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(s["chained_overhead_us_per_node_by_round"].size(), 2u);
}

// --only and --dispatch: just what was asked, and no ratio against a run that did not happen.
TEST(DispatchBenchTest, RunsOneWorkloadInOneModeWhenAsked) {
  DispatchBenchOptions o = Small();
  o.only = "chained";
  o.dispatch = "parallel";
  auto r = RunDispatchBench(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ(r->front().workload, "chained");
  EXPECT_EQ(r->front().dispatch, "parallel");
  const auto j = nlohmann::json::parse(DispatchBenchJson(o, *r));
  for (const char* key : {"chained_over_fused", "chained_parallel_over_sequential",
                          "chained_overhead_us_per_node",
                          "chained_overhead_us_per_node_paired_median"})
    EXPECT_FALSE(j["summary"].contains(key)) << key;
  EXPECT_FALSE(j["results"][0].contains("overhead_us_per_node"));
  // Names that are neither are refused.
  o.only = "chain";
  EXPECT_EQ(RunDispatchBench(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.only = "";
  o.dispatch = "async";
  EXPECT_EQ(RunDispatchBench(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pw
