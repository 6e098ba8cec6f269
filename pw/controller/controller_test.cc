// The Controller alone (no workers attached): binding rules checked before anything runs.
#include "pw/controller/controller.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

StableHloFunctionDef Spmd(int partitions) {
  const ArraySpec vec3{DType::kF32, Shape({3})};
  return StableHloFunctionDef{"psum", "module", {vec3}, {vec3}, partitions};
}

// Issue 19: an SPMD XLA module on a slice spanning worker processes failed at its first run
// (the worker's compile); it fails where it is bound, saying what to do instead.
TEST(ControllerTest, SpmdModuleAcrossWorkerProcessesFailsAtBinding) {
  Controller c(*ClusterSpec::Uniform(1, 2, 2), {.hosts_share_process = false});
  ClientId client = *c.Connect("t");
  auto spread = c.AllocateSlice(client, {.num_devices = 4});
  ASSERT_TRUE(spread.ok()) << spread.status();
  ASSERT_NE(spread->hosts.front(), spread->hosts.back());
  auto fn = c.RegisterFunction(client, Spmd(4));
  ASSERT_TRUE(fn.ok()) << fn.status();
  auto bound = c.LoadFunction(client, fn->id, spread->id);
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bound.status().message()),
              HasSubstr("spans 2 worker processes: export it per shard with runtime collectives"));
  // A one-host slice of the same size as the module binds.
  auto two = c.RegisterFunction(client, Spmd(2));
  ASSERT_TRUE(two.ok());
  auto host = c.AllocateSlice(client, {.num_devices = 2, .placement = SlicePlacement::kHost});
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE(c.LoadFunction(client, two->id, host->id).ok());
  // Per-shard modules with runtime collectives span processes.
  StableHloFunctionDef per_shard = Spmd(1);
  per_shard.collective_axis_size = 4;
  auto rt = c.RegisterFunction(client, per_shard);
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_TRUE(c.LoadFunction(client, rt->id, spread->id).ok());
}

TEST(ControllerTest, SpmdModuleSpansHostsOfOneProcess) {  // The embedded cluster.
  Controller c(*ClusterSpec::Uniform(1, 2, 2));
  ClientId client = *c.Connect("t");
  auto spread = c.AllocateSlice(client, {.num_devices = 4});
  ASSERT_TRUE(spread.ok());
  auto fn = c.RegisterFunction(client, Spmd(4));
  ASSERT_TRUE(fn.ok());
  EXPECT_TRUE(c.LoadFunction(client, fn->id, spread->id).ok());
}

// Another client's function, program or slice reads as one that does not exist (issue 20: a
// PERMISSION_DENIED naming the function revealed other clients' ids and names).
TEST(ControllerTest, AnotherClientsObjectsReadAsMissing) {
  Controller c(*ClusterSpec::Uniform(1, 1, 2));
  ClientId a = *c.Connect("a"), b = *c.Connect("b");
  auto fn = c.RegisterFunction(a, Spmd(1));
  ASSERT_TRUE(fn.ok());
  auto slice_b = c.AllocateSlice(b, {.num_devices = 1});
  ASSERT_TRUE(slice_b.ok());
  auto foreign = c.LoadFunction(b, fn->id, slice_b->id);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(foreign.status().message()), ::testing::Not(HasSubstr("psum")));
  auto missing = c.LoadFunction(b, FunctionId(999), slice_b->id);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.ReleaseSlice(a, slice_b->id).code(), absl::StatusCode::kNotFound);
}

// Issue 20: num_partitions 10^6 was accepted and stored.
TEST(ControllerTest, FunctionsLargerThanTheClusterAreRefusedAtRegistration) {
  Controller c(*ClusterSpec::Uniform(1, 2, 2));
  ClientId client = *c.Connect("t");
  auto huge = c.RegisterFunction(client, Spmd(1000000));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge.status().message()),
              HasSubstr("has 1000000 partitions and collective axis size 0, but the cluster has "
                        "only 4 devices"));
  EXPECT_TRUE(c.RegisterFunction(client, Spmd(4)).ok());
}

}  // namespace
}  // namespace pw
