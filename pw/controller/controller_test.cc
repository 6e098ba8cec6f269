// The Controller alone (no workers attached): binding rules checked before anything runs.
#include "pw/controller/controller.h"

#include <set>

#include "pw/executor/native_function.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::_;
using ::testing::HasSubstr;
using ::testing::NiceMock;
using ::testing::Return;

class MockWorker : public WorkerInterface {
 public:
  explicit MockWorker(HostId host) : host_(host) {
    ON_CALL(*this, LoadFunction).WillByDefault(Return(Future<>::Ready(absl::OkStatus())));
  }
  HostId host() const override { return host_; }
  MOCK_METHOD(Future<>, LoadFunction, (FunctionId, const FunctionDef&), (override));
  MOCK_METHOD(DispatchAck, Dispatch, (HostWork), (override));
  MOCK_METHOD(Future<>, PutShard, (BufferId, DeviceId, HostArray), (override));
  MOCK_METHOD(Future<DeviceBufferRef>, FetchShard, (BufferId, DeviceId), (override));
  MOCK_METHOD(UploadAck, ExpectUpload, (BufferId, DeviceId, const ArraySpec&), (override));
  MOCK_METHOD(Future<ShardTransfer>, OfferShard, (BufferId, DeviceId), (override));
  MOCK_METHOD(void, DeleteBuffers, (const std::vector<BufferId>&), (override));
  MOCK_METHOD(void, Unload, (const std::vector<FunctionId>&, const std::vector<uint64_t>&),
              (override));
  MOCK_METHOD(void, CancelRuns, (const std::vector<RunId>&, const absl::Status&), (override));
  MOCK_METHOD(void, ForgetRuns, (const std::vector<RunId>&), (override));
  MOCK_METHOD(Future<>, RemoveDevice, (DeviceId, const absl::Status&), (override));
  MOCK_METHOD(Future<>, RestoreDevice, (DeviceId), (override));
  MOCK_METHOD(Future<HostStatus>, Status, (), (const, override));

 private:
  HostId host_;
};

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

// A function is loaded only on the hosts of the slices it is bound to. Seen failing in the chaos
// test: registering loaded it on every worker of every island, so a client of island 1 waited
// on, and failed with, a stalled worker of island 0.
TEST(ControllerTest, AFunctionLoadsOnlyOnTheHostsOfItsSlices) {
  Controller c(*ClusterSpec::Uniform(2, 1, 2));
  NiceMock<MockWorker> w0(HostId(0)), w1(HostId(1));
  ASSERT_TRUE(c.AttachWorker(HostId(0), IslandId(0), &w0).ok());
  ASSERT_TRUE(c.AttachWorker(HostId(1), IslandId(1), &w1).ok());
  EXPECT_CALL(w0, LoadFunction).Times(0);
  EXPECT_CALL(w0, Unload).Times(0);
  EXPECT_CALL(w1, LoadFunction(FunctionId(0), _)).Times(2);  // Bound, then the host rejoined.
  EXPECT_CALL(w1, Unload(std::vector<FunctionId>{FunctionId(0)}, _)).Times(1);
  ClientId client = *c.Connect("island 1");
  auto fn = c.RegisterFunction(client, Spmd(1));
  ASSERT_TRUE(fn.ok()) << fn.status();
  auto slice = c.AllocateSlice(client, {.num_devices = 2, .islands = {IslandId(1)}});
  ASSERT_TRUE(slice.ok()) << slice.status();
  ASSERT_TRUE(c.LoadFunction(client, fn->id, slice->id).ok());
  ASSERT_TRUE(c.LoadFunction(client, fn->id, slice->id).ok());  // Loaded there already.
  c.DetachWorker(HostId(1));
  ASSERT_TRUE(c.AttachWorker(HostId(1), IslandId(1), &w1).ok());  // A fresh process: reloaded.
  ASSERT_TRUE(c.Disconnect(client).ok());
}

// A worker that fails to load a function fails the binding, naming it; a later binding retries.
TEST(ControllerTest, AFailedLoadFailsTheBindingAndIsRetried) {
  Controller c(*ClusterSpec::Uniform(1, 1, 1));
  NiceMock<MockWorker> w(HostId(0));
  ASSERT_TRUE(c.AttachWorker(HostId(0), IslandId(0), &w).ok());
  EXPECT_CALL(w, LoadFunction)
      .WillOnce(Return(
          Future<>::Ready(absl::InvalidArgumentError("host 0: compiling function 'psum'"))))
      .WillOnce(Return(Future<>::Ready(absl::OkStatus())));
  ClientId client = *c.Connect("t");
  auto fn = c.RegisterFunction(client, Spmd(1));
  auto slice = c.AllocateSlice(client, {.num_devices = 1});
  ASSERT_TRUE(fn.ok() && slice.ok());
  auto failed = c.LoadFunction(client, fn->id, slice->id);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("compiling function 'psum'"));
  EXPECT_TRUE(c.LoadFunction(client, fn->id, slice->id).ok());
}

// Issue 20 (limits): a program larger than the cluster's limit is refused, naming the limit and
// how to raise it.
TEST(ControllerTest, AProgramOverTheNodeLimitIsRefusedNamingTheLimit) {
  Controller c(*ClusterSpec::Uniform(1, 1, 1), {.max_program_nodes = 3});
  ClientId client = *c.Connect("t");
  ProgramIr ir;
  ir.name = "big";
  ir.nodes.resize(4);
  auto id = c.RegisterProgram(client, ir);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(id.status().message()),
              HasSubstr("program 'big' has 4 nodes, more than this cluster's limit of 3 (pw "
                        "controller --max-program-nodes"));
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

// Issue 20: a disconnected client's functions (their modules) and programs stayed registered
// for as long as the controller ran (seen failing: both functions and the program left).
TEST(ControllerTest, ADisconnectedClientsFunctionsAndProgramsAreFreed) {
  Controller c(*ClusterSpec::Uniform(1, 1, 2));
  ClientId gone = *c.Connect("gone"), stays = *c.Connect("stays");
  auto slice = c.AllocateSlice(gone, {.num_devices = 2});
  ASSERT_TRUE(slice.ok());
  NativeFunctionBuilder b("inc");
  int x = b.Input({DType::kF32, Shape({1})});
  auto fn = c.RegisterFunction(gone, b.Build({b.Op("add_scalar", {x}, {{"value", 1.0}})}));
  ASSERT_TRUE(fn.ok()) << fn.status();
  const ArraySpec g{DType::kF32, Shape({2})};
  const Sharding sh = Sharding::Split({2}, 1, 0);
  ProgramIr ir{"p", {g}, {{"inc", {fn->id, slice->id, {g}, {sh}, {g}, {sh}}, {{-1, 0}}}}, {{0, 0}}};
  ASSERT_TRUE(c.RegisterProgram(gone, ir).ok());
  ASSERT_TRUE(c.RegisterFunction(stays, Spmd(1)).ok());
  EXPECT_EQ(c.registry().functions, 2u);
  EXPECT_EQ(c.registry().programs, 1u);
  ASSERT_TRUE(c.Disconnect(gone).ok());
  EXPECT_EQ(c.registry().functions, 1u);
  EXPECT_EQ(c.registry().programs, 0u);
}

// Issue 24: the failure monitor takes a failed host's devices out of service without waiting
// for the workers' answers (it once waited up to 5 s per device on each worker, one after
// another, while other hosts' heartbeats went unchecked). A worker that never answers leaves
// only its own future pending.
TEST(ControllerTest, RemovingADeviceWaitsForNoWorker) {
  Controller c(*ClusterSpec::Uniform(1, 2, 1));
  NiceMock<MockWorker> w0(HostId(0)), stalled(HostId(1));
  ASSERT_TRUE(c.AttachWorker(HostId(0), IslandId(0), &w0).ok());
  ASSERT_TRUE(c.AttachWorker(HostId(1), IslandId(0), &stalled).ok());
  Promise<> never;  // The stalled worker's answer.
  EXPECT_CALL(w0, RemoveDevice).WillRepeatedly(Return(Future<>::Ready(absl::OkStatus())));
  EXPECT_CALL(stalled, RemoveDevice).WillRepeatedly(Return(never.future()));
  Future<> on_stalled = c.RemoveDevice(DeviceId(1), "its host failed");
  EXPECT_FALSE(on_stalled.IsReady());  // Its own worker's answer; and the call has returned.
  Future<> on_w0 = c.RemoveDevice(DeviceId(0), "pulled");
  ASSERT_TRUE(on_w0.IsReady());
  EXPECT_TRUE(on_w0.status().ok());
  // New work on the removed devices is refused at once, answers or not.
  ClientId client = *c.Connect("t");
  EXPECT_FALSE(c.AllocateSlice(client, {.num_devices = 1}).ok());
  never.Set();
}

// Issue 24: a plan names each slice's devices once. It once copied them into every host's
// every node (about 1 GB per cached plan for 512 hosts x 4 devices and a 128-node chain).
TEST(ControllerTest, APlanSharesEachSlicesDevicesAcrossNodesAndHosts) {
  Controller c(*ClusterSpec::Uniform(1, 3, 2));
  std::vector<std::unique_ptr<NiceMock<MockWorker>>> workers;
  pw::Mutex mu;
  std::vector<HostWork> dispatched;
  for (int h = 0; h < 3; ++h) {
    workers.push_back(std::make_unique<NiceMock<MockWorker>>(HostId(h)));
    ON_CALL(*workers.back(), Dispatch).WillByDefault([&](HostWork w) {
      pw::MutexLock lock(&mu);
      dispatched.push_back(w);
      return DispatchAck{Future<>::Ready(absl::OkStatus()), Future<int64_t>::Ready(0)};
    });
    ON_CALL(*workers.back(), PutShard).WillByDefault(Return(Future<>::Ready(absl::OkStatus())));
    ASSERT_TRUE(c.AttachWorker(HostId(h), IslandId(0), workers.back().get()).ok());
  }
  ClientId client = *c.Connect("t");
  auto slice = c.AllocateSlice(client, {.num_devices = 6});
  ASSERT_TRUE(slice.ok());
  NativeFunctionBuilder b("inc");
  int x = b.Input({DType::kF32, Shape({1})});
  auto fn = c.RegisterFunction(client, b.Build({b.Op("add_scalar", {x}, {{"value", 1.0}})}));
  ASSERT_TRUE(fn.ok()) << fn.status();
  const ArraySpec g{DType::kF32, Shape({6})};
  const Sharding sh = Sharding::Split({6}, 1, 0);
  ProgramIr ir{"chain", {g}, {}, {}};
  for (int n = 0; n < 8; ++n)
    ir.nodes.push_back({"inc", {fn->id, slice->id, {g}, {sh}, {g}, {sh}}, {{n - 1, 0}}});
  ir.outputs = {{7, 0}};
  auto program = c.RegisterProgram(client, ir);
  ASSERT_TRUE(program.ok()) << program.status();
  auto arg = c.PutArray(client, slice->id, sh,
                        *HostArray::Of<float>(DType::kF32, Shape({6}), {1, 2, 3, 4, 5, 6}));
  ASSERT_TRUE(arg.ok());
  auto run = c.Submit(client, *program, {arg->id}, {}).Await();
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(run->done.Await().ok());
  pw::MutexLock lock(&mu);
  ASSERT_EQ(dispatched.size(), 3u);  // One message per host.
  std::set<const std::vector<DeviceId>*> lists;
  for (const HostWork& w : dispatched)
    for (const NodeWork& n : w.program->nodes)
      lists.insert(std::get<ComputeWork>(n.work).slice_devices.get());
  ASSERT_EQ(lists.size(), 1u);  // 24 nodes (8 per host), one list.
  EXPECT_EQ(**lists.begin(), slice->devices);
}

// A program's plans are kept for its last kMaxPlansPerProgram (16) argument layouts; an evicted
// plan's host programs are forgotten on their workers too.
TEST(ControllerTest, APlanPerLayoutIsKeptForTheLastSixteenLayouts) {
  Controller c(*ClusterSpec::Uniform(1, 1, 1));
  NiceMock<MockWorker> w(HostId(0));
  ASSERT_TRUE(c.AttachWorker(HostId(0), IslandId(0), &w).ok());
  std::vector<uint64_t> forgotten;
  ON_CALL(w, Unload).WillByDefault([&](const std::vector<FunctionId>&,
                                       const std::vector<uint64_t>& programs) {
    forgotten.insert(forgotten.end(), programs.begin(), programs.end());
  });
  ON_CALL(w, Dispatch).WillByDefault([](HostWork) {
    return DispatchAck{Future<>::Ready(absl::OkStatus()), Future<int64_t>::Ready(0)};
  });
  ON_CALL(w, PutShard).WillByDefault(Return(Future<>::Ready(absl::OkStatus())));
  ClientId client = *c.Connect("t");
  auto slice = c.AllocateSlice(client, {.num_devices = 1});
  ASSERT_TRUE(slice.ok());
  NativeFunctionBuilder b("inc");
  int x = b.Input({DType::kF32, Shape({4})});
  auto fn = c.RegisterFunction(client, b.Build({b.Op("add_scalar", {x}, {{"value", 1.0}})}));
  ASSERT_TRUE(fn.ok()) << fn.status();
  ASSERT_TRUE(c.LoadFunction(client, fn->id, slice->id).ok());
  const ArraySpec g{DType::kF32, Shape({4})};
  const Sharding one = Sharding::Split({1}, 1, 0);
  ProgramIr ir{"p", {g}, {{"inc", {fn->id, slice->id, {g}, {one}, {g}, {one}}, {{-1, 0}}}},
               {{0, 0}}};
  auto program = c.RegisterProgram(client, ir);
  ASSERT_TRUE(program.ok()) << program.status();
  // 20 argument layouts: each on a slice of its own (slices share the one device).
  for (int i = 0; i < 20; ++i) {
    auto other = c.AllocateSlice(client, {.num_devices = 1});
    ASSERT_TRUE(other.ok());
    auto arg = c.PutArray(client, other->id, one, *HostArray::Of<float>(DType::kF32, Shape({4}),
                                                                       {1, 2, 3, 4}));
    ASSERT_TRUE(arg.ok()) << arg.status();
    auto run = c.Submit(client, *program, {arg->id}, {}).Await();
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_TRUE(run->done.Await().ok());
  }
  EXPECT_EQ(c.registry().plans, 16u);
  EXPECT_EQ(forgotten.size(), 5u);  // The registered layout's and the first four's.
  ASSERT_TRUE(c.Disconnect(client).ok());
  EXPECT_EQ(c.registry().plans, 0u);
}

}  // namespace
}  // namespace pw
