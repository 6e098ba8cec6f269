// The Controller alone (no workers attached): binding rules checked before anything runs.
#include "pw/controller/controller.h"

#include <set>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"

#include "pw/base/status_matchers.h"
#include "pw/executor/native_function.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::_;
using ::testing::AllOf;
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
  MOCK_METHOD(Future<>, SaveShard, (BufferId, DeviceId, const ShardFile&), (override));
  MOCK_METHOD(Future<>, LoadShard, (BufferId, DeviceId, const ArraySpec&, const ShardFile&),
              (override));
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

// The controller's membership: hosts' islands from the spec, workers as they attach and
// detach, a scheduler per island (one made when a host of a new island joins).
TEST(MembershipTest, WorkersComeAndGoAndEachIslandHasAScheduler) {
  std::vector<std::pair<IslandId, int>> made;
  Membership m(*ClusterSpec::Uniform(2, 1, 2), [&](IslandId island, int devices) {
    made.emplace_back(island, devices);
    return std::make_unique<IslandScheduler>(island, std::make_unique<FifoPolicy>(),
                                             [](HostId, uint64_t) -> WorkerInterface* {
                                               return nullptr;
                                             },
                                             IslandScheduler::Options{});
  });
  EXPECT_EQ(made, (std::vector<std::pair<IslandId, int>>{{IslandId(0), 2}, {IslandId(1), 2}}));
  EXPECT_EQ(m.HostIslands().at(HostId(1)), IslandId(1));
  EXPECT_EQ(m.Worker(HostId(0)), nullptr);  // Known, not joined.
  NiceMock<MockWorker> w0(HostId(0)), w2(HostId(2));
  m.Attach(HostId(0), IslandId(0), &w0);
  m.Attach(HostId(2), IslandId(3), &w2);  // A host of an island the spec did not have.
  EXPECT_EQ(m.Worker(HostId(0)), &w0);
  ASSERT_EQ(m.Schedulers().size(), 4u);
  EXPECT_NE(m.Scheduler(IslandId(3)), nullptr);
  EXPECT_EQ(m.Scheduler(IslandId(4)), nullptr);
  EXPECT_EQ(m.Members().size(), 2u);
  m.Detach(HostId(0), "its process died");
  EXPECT_EQ(m.Worker(HostId(0)), nullptr);
  EXPECT_EQ(m.Workers(), std::vector<WorkerInterface*>{&w2});
  EXPECT_EQ(m.HostIslands().at(HostId(0)), IslandId(0));  // Its island stays known.
}

// Work submitted before a host failed never reaches it, even once a new worker has joined for
// the host (it holds none of what the work reads); work submitted after does.
TEST(MembershipTest, WorkFromBeforeAHostFailedFindsNoWorkerForIt) {
  Membership m(*ClusterSpec::Uniform(1, 2, 1), [](IslandId island, int) {
    return std::make_unique<IslandScheduler>(island, std::make_unique<FifoPolicy>(),
                                             [](HostId, uint64_t) -> WorkerInterface* {
                                               return nullptr;
                                             },
                                             IslandScheduler::Options{});
  });
  NiceMock<MockWorker> w0(HostId(0)), w1(HostId(1)), again(HostId(1));
  m.Attach(HostId(0), IslandId(0), &w0);
  m.Attach(HostId(1), IslandId(0), &w1);
  const uint64_t before = m.epoch();
  EXPECT_EQ(m.Worker(HostId(1), before), &w1);
  m.Detach(HostId(1), "its process died");
  Membership::Failed failed;
  EXPECT_EQ(m.Members(&failed).size(), 1u);
  EXPECT_EQ(failed, (Membership::Failed{{HostId(1), "its process died"}}));
  m.Attach(HostId(1), IslandId(0), &again);
  EXPECT_EQ(m.Members(&failed).size(), 2u);
  EXPECT_TRUE(failed.empty());
  EXPECT_GT(m.epoch(), before);
  EXPECT_EQ(m.Worker(HostId(1), before), nullptr);
  EXPECT_EQ(m.Worker(HostId(0), before), &w0);  // Its peers still serve it.
  EXPECT_EQ(m.Worker(HostId(1), m.epoch()), &again);
}

// The controller's runs in flight: a cancelled run ends at once with the reason, and the workers
// forget it only once it has finished (a run that succeeded uncancelled is never told to them).
TEST(RunManagerTest, ACancelledRunEndsAtOnceAndWorkersForgetItWhenItFinishes) {
  NiceMock<MockWorker> w(HostId(0));
  std::vector<absl::Status> done;
  RunManager runs([&] { return std::vector<WorkerInterface*>{&w}; },
                  [&](absl::Duration, const absl::Status& s) { done.push_back(s); });
  const RunManager::Started a = runs.Start(ClientId(1), "step", absl::ZeroDuration());
  const RunManager::Started b = runs.Start(ClientId(1), "step", absl::ZeroDuration());
  EXPECT_NE(a.run, b.run);
  EXPECT_CALL(w, CancelRuns(std::vector<RunId>{a.run}, _));
  ASSERT_TRUE(runs.Cancel(a.run, absl::CancelledError("stopped by the test")).ok());
  ASSERT_TRUE(a.done.IsReady());
  EXPECT_THAT(a.done.Await().message(), HasSubstr("stopped by the test"));
  EXPECT_FALSE(b.done.IsReady());
  EXPECT_EQ(runs.Snapshot(10).in_flight, 2);

  EXPECT_CALL(w, ForgetRuns(std::vector<RunId>{a.run}));
  runs.Finish(a.run, absl::OkStatus());  // Its end stays the cancellation.
  EXPECT_EQ(a.done.Await().code(), absl::StatusCode::kCancelled);
  EXPECT_CALL(w, ForgetRuns(std::vector<RunId>{b.run})).Times(0);
  runs.Finish(b.run, absl::OkStatus());
  EXPECT_TRUE(b.done.Await().ok());
  EXPECT_EQ(done.size(), 2u);
  const RunManager::Counts counts = runs.Snapshot(10);
  EXPECT_EQ(counts.in_flight, 0);
  EXPECT_EQ(counts.completed, 2);
  EXPECT_TRUE(counts.running.empty());
  const absl::Status again = runs.Cancel(a.run, absl::CancelledError("late"));
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.message(), HasSubstr("not in flight"));
}

// A client's runs are cancelled together (ended or left to the workers to fail), others' not;
// a run past its timeout ends naming itself, its program and the timeout.
TEST(RunManagerTest, AClientsRunsAreCancelledTogetherAndATimeoutNamesTheRun) {
  NiceMock<MockWorker> w(HostId(0));
  RunManager runs([&] { return std::vector<WorkerInterface*>{&w}; }, nullptr);
  const RunManager::Started a1 = runs.Start(ClientId(1), "train", absl::ZeroDuration());
  const RunManager::Started other = runs.Start(ClientId(2), "serve", absl::ZeroDuration());
  const RunManager::Started a2 = runs.Start(ClientId(1), "train", absl::ZeroDuration());
  const RunManager::Counts listed = runs.Snapshot(2);
  ASSERT_EQ(listed.running.size(), 2u);  // Oldest first, at most as many as asked.
  EXPECT_EQ(listed.running[0].run, a1.run);
  EXPECT_EQ(listed.running[1].program, "serve");

  EXPECT_CALL(w, CancelRuns(testing::UnorderedElementsAre(a1.run, a2.run), _)).Times(2);
  const std::vector<RunId> cancelled =
      runs.CancelClient(ClientId(1), absl::CancelledError("disconnected"), /*end_them=*/false);
  EXPECT_EQ(cancelled, (std::vector<RunId>{a1.run, a2.run}));
  EXPECT_FALSE(a1.done.IsReady());  // Left to the workers to fail.
  EXPECT_EQ(runs.CancelClient(ClientId(1), absl::CancelledError("again"), /*end_them=*/true),
            cancelled);
  EXPECT_EQ(a1.done.Await().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(other.done.IsReady());
  runs.Finish(a1.run, absl::CancelledError("failed on the workers"));
  runs.Finish(a2.run, absl::CancelledError("failed on the workers"));

  // Expected before the run starts: its timeout may fire at once (on the timer's thread).
  EXPECT_CALL(w, CancelRuns(testing::SizeIs(1), _));
  const RunManager::Started slow = runs.Start(ClientId(2), "decode", absl::Milliseconds(1));
  const absl::Status timed_out = slow.done.Await();  // Its timeout ends it.
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed_out.message(), HasSubstr(slow.run.ToString() + " of program 'decode'"));
  EXPECT_THAT(timed_out.message(), HasSubstr("overran its timeout of 1ms"));
  runs.Finish(slow.run, timed_out);
  runs.Finish(other.run, absl::OkStatus());
  EXPECT_TRUE(other.done.Await().ok());
  EXPECT_EQ(runs.size(), 0u);
}

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
              HasSubstr("spans 2 hosts (worker processes, each with its own PJRT client): "
                        "export it per shard with runtime collectives"));
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

// Issue 23: the embedded cluster's hosts have a PJRT client each, as worker processes have, so
// an SPMD module across its hosts fails at binding as on a process cluster (it used to bind).
TEST(ControllerTest, SpmdModuleAcrossHostsOfOneProcessFailsAtBindingToo) {
  Controller c(*ClusterSpec::Uniform(1, 2, 2));  // hosts_share_process: the embedded cluster.
  ClientId client = *c.Connect("t");
  auto spread = c.AllocateSlice(client, {.num_devices = 4});
  ASSERT_TRUE(spread.ok());
  auto fn = c.RegisterFunction(client, Spmd(4));
  ASSERT_TRUE(fn.ok());
  EXPECT_THAT(c.LoadFunction(client, fn->id, spread->id).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("spans 2 hosts")));
}

// A function is loaded only on the hosts of the slices it is bound to. Seen failing in the chaos
// test: registering loaded it on every worker of every island, so a client of island 1 waited
// on, and failed with, a stalled worker of island 0.
TEST(ControllerTest, AFunctionLoadsOnlyOnTheHostsOfItsSlices) {
  Controller c(*ClusterSpec::Uniform(2, 1, 2));
  NiceMock<MockWorker> w0(HostId(0)), w1(HostId(1));
  ASSERT_TRUE(c.JoinHost(HostId(0), IslandId(0), &w0).ok());
  ASSERT_TRUE(c.JoinHost(HostId(1), IslandId(1), &w1).ok());
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
  c.FailHost(HostId(1), "its process died");
  ASSERT_TRUE(c.JoinHost(HostId(1), IslandId(1), &w1).ok());  // A fresh process: reloaded.
  ASSERT_TRUE(c.Disconnect(client).ok());
}

// A client that disconnects while one of its calls is in progress: its new calls are refused at
// once, and what it held is freed once that call ends, including what the call made. Seen
// failing: the function a worker was still loading when its client left was never unloaded
// there (the disconnect freed the function before the load had marked the host).
TEST(ControllerTest, AClientLeavingMidCallIsFreedWhenTheCallEnds) {
  Controller c(*ClusterSpec::Uniform(1, 1, 2));
  NiceMock<MockWorker> w(HostId(0));
  ASSERT_TRUE(c.JoinHost(HostId(0), IslandId(0), &w).ok());
  Promise<> loaded;
  absl::Notification loading;
  const Future<> load = loaded.future();
  EXPECT_CALL(w, LoadFunction(FunctionId(0), _)).WillOnce([&](FunctionId, const FunctionDef&) {
    loading.Notify();
    return load;
  });
  EXPECT_CALL(w, Unload(std::vector<FunctionId>{FunctionId(0)}, _)).Times(1);
  ClientId client = *c.Connect("leaves");
  auto fn = c.RegisterFunction(client, Spmd(1));
  auto slice = c.AllocateSlice(client, {.num_devices = 2});
  ASSERT_TRUE(fn.ok() && slice.ok());
  std::thread call([&] { EXPECT_TRUE(c.LoadFunction(client, fn->id, slice->id).ok()); });
  bool ended = false;
  auto end_call = absl::MakeCleanup([&] {  // On every path, so the thread is always joined.
    if (!std::exchange(ended, true)) loaded.Set();
    call.join();
  });
  ASSERT_TRUE(loading.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(c.Disconnect(client).ok());  // Does not wait for the call.
  auto refused = c.AllocateSlice(client, {.num_devices = 1});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("is not connected"));
  EXPECT_EQ(c.Disconnect(client).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(c.registry().functions, 1u);  // Held for the call in progress.
  EXPECT_EQ(c.registry().clients, 1u);
  std::move(end_call).Invoke();
  EXPECT_EQ(c.registry().functions, 0u);
  EXPECT_EQ(c.registry().clients, 0u);
  EXPECT_EQ(c.registry().tenants, 0u);
}

// A worker that fails to load a function fails the binding, naming it; a later binding retries.
TEST(ControllerTest, AFailedLoadFailsTheBindingAndIsRetried) {
  Controller c(*ClusterSpec::Uniform(1, 1, 1));
  NiceMock<MockWorker> w(HostId(0));
  ASSERT_TRUE(c.JoinHost(HostId(0), IslandId(0), &w).ok());
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

// A native function whose intermediate values could never fit its devices is refused at
// binding, naming the bytes, the device and the slice (its launches would only fail; before the
// check, a worker aborted allocating them).
TEST(ControllerTest, AFunctionWhoseIntermediatesExceedTheDevicesIsRefusedAtBinding) {
  Controller c(*ClusterSpec::Uniform(1, 1, 1, /*device_memory_bytes=*/1 << 20));
  NiceMock<MockWorker> w(HostId(0));
  ASSERT_TRUE(c.JoinHost(HostId(0), IslandId(0), &w).ok());
  EXPECT_CALL(w, LoadFunction).Times(0);
  ClientId client = *c.Connect("t");
  NativeFunctionBuilder b("outer");
  const int x = b.Input({DType::kF32, Shape({1024, 1})});
  const int y = b.Input({DType::kF32, Shape({1, 1024})});
  b.Op("matmul", {x, y});  // f32[1024,1024]: 4 MiB, never an output.
  auto fn = c.RegisterFunction(client, b.Build({b.Op("neg", {x})}));
  auto slice = c.AllocateSlice(client, {.num_devices = 1});
  ASSERT_TRUE(fn.ok() && slice.ok());
  EXPECT_THAT(c.LoadFunction(client, fn->id, slice->id).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("function 'outer' needs 4194304 bytes on device:0"),
                             HasSubstr("for its intermediate values"),
                             HasSubstr("has only 1048576 bytes"))));
}

// Bound to a 1-device slice, an all_gather's intermediate fits; the same function in a program on
// 8 devices gathers 8 times as much. The program is refused too, not only the binding.
TEST(ControllerTest, AProgramWhoseNodesIntermediatesExceedTheDevicesIsRefused) {
  Controller c(*ClusterSpec::Uniform(1, 1, 8, /*device_memory_bytes=*/1 << 20));
  NiceMock<MockWorker> w(HostId(0));
  ASSERT_TRUE(c.JoinHost(HostId(0), IslandId(0), &w).ok());
  ClientId client = *c.Connect("t");
  NativeFunctionBuilder b("gather");
  const int x = b.Input({DType::kF32, Shape({65536})});  // 256 KiB a shard.
  b.Op("all_gather", {x});                               // 256 KiB x the shard count.
  auto fn = c.RegisterFunction(client, b.Build({b.Op("neg", {x})}));
  auto one = c.AllocateSlice(client, {.num_devices = 1});
  auto eight = c.AllocateSlice(client, {.num_devices = 8});
  ASSERT_TRUE(fn.ok() && one.ok() && eight.ok());
  ASSERT_TRUE(c.LoadFunction(client, fn->id, one->id).ok());
  const ArraySpec g{DType::kF32, Shape({8 * 65536})};
  const Sharding sh = Sharding::Split({8}, 1, 0);
  ProgramIr ir{"p", {g}, {}, {}};
  ir.nodes.push_back({"gather", {fn->id, eight->id, {g}, {sh}, {g}, {sh}}, {{-1, 0}}});
  ir.outputs = {{0, 0}};
  EXPECT_THAT(c.RegisterProgram(client, ir).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("function 'gather' needs 2097152 bytes"),
                             HasSubstr("program 'p' node 'gather''s slice"),
                             HasSubstr("intermediate values"))));
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
  ASSERT_TRUE(c.LoadFunction(gone, fn->id, slice->id).ok());  // Bound, as clients do.
  ASSERT_TRUE(c.RegisterProgram(gone, ir).ok());
  ASSERT_TRUE(c.RegisterFunction(stays, Spmd(1)).ok());
  EXPECT_EQ(c.registry().functions, 2u);
  EXPECT_EQ(c.registry().programs, 1u);
  ASSERT_TRUE(c.Disconnect(gone).ok());
  EXPECT_EQ(c.registry().functions, 1u);
  EXPECT_EQ(c.registry().programs, 0u);
}

// A shared service: one client cannot grow the controller without bound by registering
// functions or programs (they stay until it leaves). Past its limits a registration is refused,
// naming the flag; other clients are unaffected, and leaving frees its room.
TEST(ControllerTest, AClientsRegistrationsPastItsLimitsAreRefusedNamingTheFlag) {
  Controller::Options o;
  o.definitions = {.max_functions = 2, .max_function_bytes = 100, .max_programs = 1};
  Controller c(*ClusterSpec::Uniform(1, 1, 2), o);
  ClientId greedy = *c.Connect("greedy"), other = *c.Connect("other"), big = *c.Connect("big");
  const StableHloFunctionDef psum = Spmd(1);
  ASSERT_EQ(DefinitionBytes(psum), 42);  // "psum", "module" and two specs of rank 1.
  NativeFunctionBuilder b("inc");
  int x = b.Input({DType::kF32, Shape({1})});
  const NativeFunctionDef inc = b.Build({b.Op("add_scalar", {x}, {{"value", 1.0}})});
  ASSERT_EQ(DefinitionBytes(inc), 50);  // Name, input spec, output, the op and its attribute.
  ASSERT_TRUE(c.RegisterFunction(greedy, psum).ok());
  auto fn = c.RegisterFunction(greedy, inc);  // 92 bytes in all.
  ASSERT_TRUE(fn.ok()) << fn.status();
  auto over_count = c.RegisterFunction(greedy, inc);
  EXPECT_EQ(over_count.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over_count.status().message()),
              HasSubstr("has 2 functions registered, its limit (pw controller "
                        "--max-client-functions)"));
  StableHloFunctionDef large = Spmd(1);
  large.module.assign(100, 'm');
  auto over_bytes = c.RegisterFunction(big, large);
  EXPECT_EQ(over_bytes.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over_bytes.status().message()),
              HasSubstr("(136 bytes of definition) was not registered: " + big.ToString() +
                        "'s functions already hold 0 bytes, and its limit is 100 (pw controller "
                        "--max-client-function-bytes)"));
  auto slice = c.AllocateSlice(greedy, {.num_devices = 2});
  ASSERT_TRUE(slice.ok());
  const ArraySpec g{DType::kF32, Shape({2})};
  const Sharding sh = Sharding::Split({2}, 1, 0);
  ProgramIr ir{"p", {g}, {{"inc", {fn->id, slice->id, {g}, {sh}, {g}, {sh}}, {{-1, 0}}}}, {{0, 0}}};
  ASSERT_TRUE(c.LoadFunction(greedy, fn->id, slice->id).ok());
  ASSERT_TRUE(c.RegisterProgram(greedy, ir).ok());
  auto over_programs = c.RegisterProgram(greedy, ir);
  EXPECT_EQ(over_programs.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over_programs.status().message()),
              HasSubstr("program 'p' was not registered: " + greedy.ToString() +
                        " has 1 programs registered, its limit (pw controller "
                        "--max-client-programs)"));
  EXPECT_EQ(c.registry().functions, 2u);
  EXPECT_EQ(c.registry().programs, 1u);
  // Another client has room of its own.
  EXPECT_TRUE(c.RegisterFunction(other, psum).ok());
  // Leaving frees the greedy client's room (a new connection starts empty).
  ASSERT_TRUE(c.Disconnect(greedy).ok());
  ClientId again = *c.Connect("greedy");
  EXPECT_TRUE(c.RegisterFunction(again, inc).ok());
  EXPECT_TRUE(c.RegisterFunction(again, inc).ok());
}

// Issue 24: the failure monitor takes a failed host's devices out of service without waiting
// for the workers' answers (it once waited up to 5 s per device on each worker, one after
// another, while other hosts' heartbeats went unchecked). A worker that never answers leaves
// only its own future pending.
TEST(ControllerTest, RemovingADeviceWaitsForNoWorker) {
  Controller c(*ClusterSpec::Uniform(1, 2, 1));
  NiceMock<MockWorker> w0(HostId(0)), stalled(HostId(1));
  ASSERT_TRUE(c.JoinHost(HostId(0), IslandId(0), &w0).ok());
  ASSERT_TRUE(c.JoinHost(HostId(1), IslandId(0), &stalled).ok());
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
      return DispatchAck{Future<absl::Time>::Ready(absl::Now()), Future<int64_t>::Ready(0)};
    });
    ON_CALL(*workers.back(), PutShard).WillByDefault(Return(Future<>::Ready(absl::OkStatus())));
    ON_CALL(*workers.back(), LoadFunction)
        .WillByDefault(Return(Future<>::Ready(absl::OkStatus())));
    ASSERT_TRUE(c.JoinHost(HostId(h), IslandId(0), workers.back().get()).ok());
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
  ASSERT_TRUE(c.LoadFunction(client, fn->id, slice->id).ok());
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
  ASSERT_TRUE(c.JoinHost(HostId(0), IslandId(0), &w).ok());
  std::vector<uint64_t> forgotten;
  ON_CALL(w, Unload).WillByDefault([&](const std::vector<FunctionId>&,
                                       const std::vector<uint64_t>& programs) {
    forgotten.insert(forgotten.end(), programs.begin(), programs.end());
  });
  ON_CALL(w, Dispatch).WillByDefault([](HostWork) {
    return DispatchAck{Future<absl::Time>::Ready(absl::Now()), Future<int64_t>::Ready(0)};
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
