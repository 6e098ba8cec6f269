// End-to-end tests of the core through the client API, on both transports: the embedded
// cluster and a gRPC cluster (same Controller and Worker behind the interfaces).
#include "pw/embedded/embedded_cluster.h"

#include <atomic>
#include <deque>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/base/heap.h"
#include "pw/base/status_matchers.h"
#include "pw/client/client.h"
#include "pw/examples/figure2.h"
#include "pw/rpc/remote_controller.h"
#include "pw/server/controller_server.h"
#include "pw/server/worker_server.h"
#include "pw/trace/trace.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kDeadlockTimeout = absl::Seconds(60);

NativeFunctionDef ScalarFn(const std::string& name, const std::string& kernel, double v,
                           DType t = DType::kF32, Shape s = Shape({})) {
  NativeFunctionBuilder b(name);
  int x = b.Input({t, s});
  return b.Build({b.Op(kernel, {x}, {{"value", v}})});
}

// (a, b) -> kernel(a, b) on scalar shards.
NativeFunctionDef BinaryFn(const std::string& kernel, DType t) {
  NativeFunctionBuilder b(kernel);
  int x = b.Input({t, Shape({})}), y = b.Input({t, Shape({})});
  return b.Build({b.Op(kernel, {x, y})});
}

// x -> all_reduce_sum(x) + 1 on every shard.
NativeFunctionDef ReduceAddFn(const std::string& name) {
  NativeFunctionBuilder b(name);
  int x = b.Input({DType::kF32, Shape({})});
  int r = b.Op("all_reduce_sum", {x});
  return b.Build({b.Op("add_scalar", {r}, {{"value", 1.0}})});
}

HostArray F32(std::vector<float> v) {
  int64_t n = static_cast<int64_t>(v.size());
  return *HostArray::Of<float>(DType::kF32, Shape({n}), v);
}

std::vector<float> Values(const Array& a) {
  auto h = a.ToHost();
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? h->values<float>() : std::vector<float>{};
}

// A call's outcome: its error, or its outputs' (a run the controller refuses fails them; in one
// process the call itself returns the refusal).
absl::Status CallStatus(const absl::StatusOr<std::vector<Array>>& outs) {
  if (!outs.ok()) return outs.status();
  return outs->empty() ? absl::OkStatus() : outs->front().Ready().status();
}

// Every test runs on both transports: the embedded cluster (in-process) and a gRPC cluster (a
// ControllerServer and one WorkerServer per host, clients through RemoteController), on loopback
// sockets and on gRPC's in-process transport (rpc/in_process.h: the same messages, no socket).
enum class Transport { kInProcess, kGrpc, kGrpcInProcess };

class ClusterTest : public ::testing::TestWithParam<Transport> {
 protected:
  bool grpc() const { return GetParam() != Transport::kInProcess; }
  // "127.0.0.1:0", or a fresh in-process name.
  static std::string Listen(Transport t) {
    static std::atomic<int> next{0};
    return t == Transport::kGrpcInProcess ? absl::StrCat("inproc:cluster-test-", next++)
                                          : "127.0.0.1:0";
  }
  void Start(int islands, int hosts, int devices, int64_t memory = ClusterSpec::kDefaultDeviceMemory) {
    const ClusterSpec spec = *ClusterSpec::Uniform(islands, hosts, devices, memory);
    if (!grpc()) {
      EmbeddedCluster::Options eo;
      eo.controller.max_client_bytes = client_quota_;
      eo.controller.definitions = definitions_;
      eo.controller.checkpoint_root = checkpoint_root_;
      embedded_ = *EmbeddedCluster::Create(spec, eo);
      controller_ = &embedded_->controller();
      api_ = controller_;
      return;
    }
    // Heartbeats are not under test here: a stall of this loaded VM must not fail a host.
    server::ControllerServer::Options o;
    o.failure_timeout = kDeadlockTimeout;
    o.max_client_bytes = client_quota_;
    o.definitions = definitions_;
    o.checkpoint_root = checkpoint_root_;
    o.clients.max_runs_in_flight = runs_in_flight_limit_;
    o.listen = Listen(GetParam());
    auto server = server::ControllerServer::Start(spec, o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    for (const HostSpec& h : spec.hosts()) {
      auto w = server::WorkerServer::Start({.controller = server_->address(), .host = h.id,
                                            .listen = Listen(GetParam()),
                                            .channel = {.token = server_->cluster_token()}});
      ASSERT_TRUE(w.ok()) << w.status();
      workers_.push_back(*std::move(w));
    }
    const absl::Time deadline = absl::Now() + kDeadlockTimeout;
    while (server_->alive_hosts() != static_cast<int>(spec.hosts().size()) &&
           absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(5));
    auto remote = rpc::RemoteController::Dial(server_->address(), {});
    ASSERT_TRUE(remote.ok()) << remote.status();
    remote_ = *std::move(remote);
    controller_ = &server_->controller();
    api_ = remote_.get();
  }
  void TearDown() override {
    remote_.reset();
    server_.reset();  // First: it closes the workers' command streams.
    workers_.clear();
    embedded_.reset();
    if (!checkpoint_root_.empty()) std::filesystem::remove_all(checkpoint_root_);
  }
  // The host's worker fails: in process EmbeddedCluster::FailHost; over gRPC its WorkerServer
  // stops (its streams end, naming it), and the controller's failure monitor notices.
  void FailHost(HostId host) {
    if (!grpc()) {
      const absl::Status failed = embedded_->FailHost(host, "failed by the test");
      ASSERT_TRUE(failed.ok()) << failed;
      return;
    }
    workers_[host.value()].reset();
    WaitForAliveHosts(static_cast<int>(workers_.size()) - 1);
  }
  // A new worker for the failed host joins.
  void RestartHost(HostId host) {
    if (!grpc()) {
      const absl::Status restarted = embedded_->RestartHost(host);
      ASSERT_TRUE(restarted.ok()) << restarted;
      return;
    }
    auto w = server::WorkerServer::Start({.controller = server_->address(), .host = host,
                                          .listen = Listen(GetParam()),
                                          .channel = {.token = server_->cluster_token()}});
    ASSERT_TRUE(w.ok()) << w.status();
    workers_[host.value()] = *std::move(w);
    WaitForAliveHosts(static_cast<int>(workers_.size()));
  }
  void WaitForAliveHosts(int n) {
    const absl::Time deadline = absl::Now() + kDeadlockTimeout;
    while (server_->alive_hosts() != n && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(5));
    ASSERT_EQ(server_->alive_hosts(), n);
  }
  // What clients talk to: the controller itself, or its gRPC stub.
  ControllerInterface* api() { return api_; }
  int64_t client_quota_ = 0;  // Controller::Options::max_client_bytes for Start.
  Controller::Options::Definitions definitions_;  // Controller::Options::definitions for Start.
  std::string checkpoint_root_;  // Controller::Options::checkpoint_root for Start.
  // A fresh checkpoint root for Start, removed at TearDown.
  void UseCheckpointRoot() {
    char tmpl[] = "/tmp/pw-checkpoint-test.XXXXXX";
    checkpoint_root_ = mkdtemp(tmpl);
  }
  int64_t runs_in_flight_limit_ = rpc::ClientLimits{}.max_runs_in_flight;  // Over the wire.
  // The controller (in this process either way): status, device removal.
  Controller& controller() { return *controller_; }
  EmbeddedCluster* embedded_for_test() { return embedded_.get(); }
  server::ControllerServer* server_for_test() { return server_.get(); }
  std::unique_ptr<Client> Connect(const std::string& name) {
    return *Client::Connect(api_, name);
  }
  // Every host's object store is empty and no memory is held (deletes reach gRPC workers
  // asynchronously, so this waits for them).
  void ExpectNothingLeft() {
    controller().WaitIdle();
    const absl::Time deadline = absl::Now() + kDeadlockTimeout;
    ClusterStatus s;
    auto empty = [&] {
      s = StatusOfEveryHost(controller()).value();
      if (s.logical_buffers != 0 || s.runs_in_flight != 0) return false;
      for (const auto& h : s.hosts) {
        if (h.buffers != 0 || h.buffer_bytes != 0) return false;
        for (const auto& d : h.devices)
          if (d.memory_in_use != 0) return false;
      }
      return true;
    };
    while (!empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    EXPECT_EQ(s.logical_buffers, 0u);
    EXPECT_EQ(s.runs_in_flight, 0u);
    for (const auto& h : s.hosts) {
      EXPECT_EQ(h.buffers, 0u) << h.host;
      EXPECT_EQ(h.buffer_bytes, 0) << h.host;
      for (const auto& d : h.devices) EXPECT_EQ(d.memory_in_use, 0) << d.id;
    }
  }

 private:
  std::unique_ptr<EmbeddedCluster> embedded_;
  std::unique_ptr<server::ControllerServer> server_;
  std::vector<std::unique_ptr<server::WorkerServer>> workers_;
  std::unique_ptr<rpc::RemoteController> remote_;
  Controller* controller_ = nullptr;
  ControllerInterface* api_ = nullptr;
};

TEST_P(ClusterTest, ChainedProgramMatchesOpByOpAndSequential) {
  Start(1, 2, 2);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
  BoundFunction step = *c->Pmap(ReduceAddFn("step"), s);
  Program p = *c->Trace("chain", {{DType::kF32, Shape({4})}}, [&](std::vector<Value> v) {
    Value x = v[0];
    for (int i = 0; i < 3; ++i) x = step(x);
    return std::vector<Value>{x};
  });
  // [1,2,3,4] -> 11 -> 45 -> 181 on every shard.
  for (DispatchMode mode : {DispatchMode::kParallel, DispatchMode::kSequential}) {
    auto out = p.Call({F32({1, 2, 3, 4})}, mode);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Values((*out)[0]), (std::vector<float>{181, 181, 181, 181}));
  }
  Array x = *c->Put(F32({1, 2, 3, 4}), s.info().id, Sharding::Split({4}, 1, 0));
  for (int i = 0; i < 3; ++i) x = (*step.Call({x}))[0];
  EXPECT_EQ(Values(x), (std::vector<float>{181, 181, 181, 181}));
}

TEST_P(ClusterTest, ReshardsBetweenShardings) {
  Start(2, 1, 2);
  auto c = Connect("c");
  Slice s0 = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  Slice s1 = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  ASSERT_NE(s0.info().islands, s1.info().islands);
  FunctionInfo neg4 = *c->Register([] {
    NativeFunctionBuilder b("neg4");
    int x = b.Input({DType::kF32, Shape({4})});
    return b.Build({b.Op("neg", {x})});
  }());
  FunctionInfo neg2 = *c->Register([] {
    NativeFunctionBuilder b("neg2");
    int x = b.Input({DType::kF32, Shape({2})});
    return b.Build({b.Op("neg", {x})});
  }());
  ArraySpec g{DType::kF32, Shape({4})};
  // On s0: split in halves. On s1: replicated (each device the whole array).
  BoundFunction split = *c->Bind(neg2, s0, {g}, {Sharding::Split({2}, 1, 0)}, {g},
                                 {Sharding::Split({2}, 1, 0)});
  BoundFunction rep = *c->Bind(neg4, s1, {g}, {Sharding::Replicated({2}, 1)}, {g},
                               {Sharding::Replicated({2}, 1)});
  Program p = *c->Trace("reshard", {g}, [&](std::vector<Value> v) {
    return std::vector<Value>{rep(split(v[0]))};
  });
  auto out = p.Call({F32({1, 2, 3, 4})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Values((*out)[0]), (std::vector<float>{1, 2, 3, 4}));
  const LinkBytes after_gather = ReceivedBytes(controller()).value();
  EXPECT_EQ(after_gather.dcn, 2 * 16) << "each replica receives the whole f32[4] over DCN";
  // Over the wire, s1's host fetched each half (8 bytes) once for both its replicas; in process
  // nothing moved.
  EXPECT_EQ(after_gather.dcn_wire, grpc() ? 2 * 8 : 0);

  // Back: both halves are cut from one replica, fetched once, whole, over the wire (16 bytes).
  Program back = *c->Trace(
      "unshard", {g}, [&](std::vector<Value> v) { return std::vector<Value>{split(rep(v[0]))}; });
  out = back.Call({F32({1, 2, 3, 4})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Values((*out)[0]), (std::vector<float>{1, 2, 3, 4}));
  const LinkBytes after_split = ReceivedBytes(controller()).value();
  EXPECT_EQ(after_split.dcn - after_gather.dcn, 2 * 8);
  EXPECT_EQ(after_split.dcn_wire - after_gather.dcn_wire, grpc() ? 16 : 0);
  EXPECT_EQ(after_split.ici, 0);
  EXPECT_EQ(after_split.ici_wire, 0);
}

// Checkpoints (pw/checkpoint): the workers write each distinct shard as a zarr chunk (a
// replicated array once), the controller commits by renaming, and a load reads any sharding back.
TEST_P(ClusterTest, CheckpointsAreWrittenByWorkersCommittedAndLoadedInAnotherSharding) {
  UseCheckpointRoot();
  Start(1, 2, 2);
  auto c = Connect("c");
  Slice four = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
  Slice two = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  const ArraySpec g{DType::kF32, Shape({4, 2})};
  Array w = *c->Put(*HostArray::Of<float>(DType::kF32, Shape({4, 2}), {0, 1, 2, 3, 4, 5, 6, 7}),
                    four.info().id, Sharding::Split({4}, 2, 0));
  Array b = *c->Put(F32({8, 9, 10}), two.info().id, Sharding::Replicated({2}, 1));
  ASSERT_TRUE(w.Save("ck.tmp/w").Await().ok());
  ASSERT_TRUE(b.Save(checkpoint_root_ + "/ck.tmp/b").Await().ok());  // Absolute, within the root.
  const std::string tmp = checkpoint_root_ + "/ck.tmp";
  for (const char* chunk : {"0.0", "1.0", "2.0", "3.0"})
    EXPECT_EQ(std::filesystem::file_size(tmp + "/w/" + chunk), 8u) << chunk;
  EXPECT_EQ(std::filesystem::file_size(tmp + "/b/0"), 12u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tmp + "/b"), {}), 2)
      << "one chunk and .zarray: the replicas wrote once";
  auto checkpoint_bytes = [&] {
    std::pair<int64_t, int64_t> sum;
    const ClusterStatus status = StatusOfEveryHost(*api()).value();  // Lives through the loop.
    for (const HostStatus& h : status.hosts) {
      sum.first += h.checkpoint_bytes_saved;
      sum.second += h.checkpoint_bytes_loaded;
    }
    return sum;
  };
  EXPECT_EQ(checkpoint_bytes(), std::make_pair(int64_t{4 * 8 + 12}, int64_t{0}));

  auto committed = c->CommitCheckpoint("ck.tmp", {{"_METADATA", "{}"}}, "run/ck");
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, checkpoint_root_ + "/run/ck");
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_TRUE(std::filesystem::exists(*committed + "/_METADATA"));
  std::filesystem::create_directories(tmp);
  EXPECT_THAT(c->CommitCheckpoint("ck.tmp", {}, "run/ck").status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("a checkpoint exists at")));

  // Halves on two devices (each from two chunks), and the replicated one on four.
  Array w2 = *c->Load(two.info().id, Sharding::Split({2}, 2, 0), g, "run/ck/w");
  EXPECT_EQ(w2.ToHost()->values<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  Array b4 = *c->Load(four.info().id, Sharding::Replicated({4}, 1),
                      {DType::kF32, Shape({3})}, "run/ck/b");
  EXPECT_EQ(Values(b4), (std::vector<float>{8, 9, 10}));
  EXPECT_EQ(checkpoint_bytes().second, 2 * 16 + 4 * 12) << "each shard read by its worker";

  EXPECT_THAT(c->Load(two.info().id, Sharding::Split({2}, 1, 0), {DType::kF32, Shape({8})},
                      "run/ck/w").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is f32[4,2], not f32[8]")));
  EXPECT_THAT(c->Load(two.info().id, Sharding::Split({2}, 2, 0), g, "run/none").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("run/none/.zarray")));
  EXPECT_THAT(w.Save("../x").Await(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has a \"..\"")));
  EXPECT_THAT(w.Save("/etc/x").Await(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not within the cluster's checkpoint root")));
  EXPECT_THAT(c->CommitCheckpoint("run", {{".zarray", ""}}, "x").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("file name \".zarray\"")));
  // A committed checkpoint's metadata is never overwritten.
  EXPECT_THAT(c->CommitCheckpoint("run/ck", {{"_METADATA", "x"}}, "run/ck2").status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("_METADATA exists")));
}

// A save of an array whose run failed ends with the run's error (the workers were asked only
// once it was made), and an array of no elements is saved (no chunks) and loaded back.
TEST_P(ClusterTest, CheckpointsOfAFailedArrayFailAndOfAnEmptyOneRoundTrip) {
  UseCheckpointRoot();
  Start(1, 2, 1);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  NativeFunctionBuilder b("bad");
  int x = b.Input({DType::kF32, Shape({})});
  BoundFunction bad = *c->Pmap(b.Build({b.Op("hold_device", {x}, {{"micros", -1}})}), s);
  auto out = bad.Call({*c->Put(F32({1, 2}), s.info().id, Sharding::Split({2}, 1, 0))});
  ASSERT_TRUE(out.ok()) << out.status();
  Future<> saved = (*out)[0].Save("failed");
  ASSERT_TRUE(saved.AwaitFor(kDeadlockTimeout)) << "the save of a failed array never ended";
  EXPECT_THAT(saved.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("micros -1 is outside")));

  const ArraySpec empty{DType::kF32, Shape({0, 2})};
  Array e = *c->Put(HostArray{empty, {}}, s.info().id, Sharding::Split({2}, 2, 1));
  ASSERT_TRUE(e.Save("empty").Await().ok());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(checkpoint_root_ + "/empty"), {}),
            1) << "only .zarray";
  Array back = *c->Load(s.info().id, Sharding::Split({2}, 2, 1), empty, "empty");
  auto h = back.ToHost();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->spec, empty);
}

// Two clients submit programs whose collectives span the same devices in different orders
// concurrently. Every device sees one order (the island scheduler's), so all complete.
TEST_P(ClusterTest, ConcurrentClientsWithCollectivesDoNotDeadlock) {
  Start(1, 2, 2);
  constexpr int kRuns = 150;
  std::atomic<int> completed{0};
  auto client_loop = [&](int id) {
    auto c = Connect(absl::StrCat("client", id));
    auto set = c->MakeVirtualDeviceSet();
    Slice all = *set.AddSlice({.num_devices = 4});
    Slice half = *set.AddSlice({.num_devices = 2});
    BoundFunction on_all = *c->Pmap(ReduceAddFn("all"), all);
    BoundFunction on_half = *c->Pmap(ReduceAddFn("half"), half);
    // Client 0 runs all -> half, client 1 half -> all, so a device would see both clients'
    // collectives in opposite orders without gang scheduling.
    Program p4 = *c->Trace("p4", {{DType::kF32, Shape({4})}}, [&](std::vector<Value> v) {
      return std::vector<Value>{on_all(on_all(v[0]))};
    });
    Program p2 = *c->Trace("p2", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
      return std::vector<Value>{on_half(on_half(v[0]))};
    });
    Array a4 = *c->Put(F32({0, 0, 0, 0}), all.info().id, Sharding::Split({4}, 1, 0));
    Array a2 = *c->Put(F32({0, 0}), half.info().id, Sharding::Split({2}, 1, 0));
    std::vector<Future<>> done;
    for (int i = 0; i < kRuns; ++i) {
      const Program& first = id == 0 ? p4 : p2;
      const Program& second = id == 0 ? p2 : p4;
      auto r1 = first.RunAsync({id == 0 ? a4 : a2});
      auto r2 = second.RunAsync({id == 0 ? a2 : a4});
      ASSERT_TRUE(r1.ok() && r2.ok());
      done.push_back(r1->second);
      done.push_back(r2->second);
    }
    for (auto& f : done) {
      ASSERT_TRUE(f.AwaitFor(kDeadlockTimeout)) << "deadlock: a run did not finish";
      ASSERT_TRUE(f.status().ok()) << f.status();
      completed++;
    }
    // 0 -> 4*0+1 = 1 -> 4*1+1 = 5 on 4 devices; 0 -> 1 -> 3 on 2 devices.
    auto out = p4.Run({a4});
    EXPECT_EQ(Values((*out)[0]), (std::vector<float>{5, 5, 5, 5}));
  };
  std::thread t0(client_loop, 0), t1(client_loop, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(completed.load(), 4 * kRuns);
  // The 4-device slice spans both hosts, whose collectives meet across the ICI link in both
  // modes (in process too, each host has its own): per p4 run (kRuns + 1 per client), two
  // all-reduces, each host receiving the other's two f32 inputs. Only the wire moved them.
  const LinkBytes moved = ReceivedBytes(controller()).value();
  EXPECT_EQ(moved.ici, 2 * (kRuns + 1) * 2 * (2 * 2 * 4));
  EXPECT_EQ(moved.ici_wire, grpc() ? moved.ici : 0);
  ExpectNothingLeft();
}

// Issue 24: 1,000 runs with collectives from four clients of three tenants with different
// shares, in random order and mode: single-island programs on overlapping slices and programs
// that cross islands and back (so each island's proportional-share policy reorders them
// against each other's), and runs on another client's arrays still being made. Every run
// finishes; none deadlocks.
TEST_P(ClusterTest, RandomizedTenantsAcrossIslandsNeverDeadlock) {
  Start(2, 2, 2);
  constexpr int kClients = 4, kRunsPerClient = 250;
  const ConnectOptions tenants[kClients] = {
      {"a", 1}, {"a", 1}, {"b", 3}, {"", 0}};  // Two share a tenant; the last is its own.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(*Client::Connect(api(), absl::StrCat("client", i), tenants[i]));
  // Client 0 shares its runs' outputs, as they are made, with client 1 (a channel of tokens).
  pw::Mutex mu;
  std::deque<std::string> shared;  // Under mu.
  std::atomic<int> completed{0};
  auto client_loop = [&](int id) {
    Client& c = *clients[id];
    std::mt19937 rng(1234 + id);
    auto set = c.MakeVirtualDeviceSet();
    Slice i0 = *set.AddSlice({.num_devices = 4, .islands = {IslandId(0)}});
    Slice i0_half = *set.AddSlice({.num_devices = 2, .islands = {IslandId(0)}});
    Slice i1 = *set.AddSlice({.num_devices = 4, .islands = {IslandId(1)}});
    BoundFunction on_i0 = *c.Pmap(ReduceAddFn("i0"), i0);
    BoundFunction on_i0_half = *c.Pmap(ReduceAddFn("i0_half"), i0_half);
    BoundFunction on_i1 = *c.Pmap(ReduceAddFn("i1"), i1);
    const ArraySpec v4{DType::kF32, Shape({4})}, v2{DType::kF32, Shape({2})};
    std::vector<Program> four = {
        *c.Trace("i0", {v4}, [&](std::vector<Value> v) { return std::vector{on_i0(v[0])}; }),
        *c.Trace("i1", {v4}, [&](std::vector<Value> v) { return std::vector{on_i1(v[0])}; }),
        // 0 -> 1 -> 5 -> 21: island 0, island 1, island 0 again.
        *c.Trace("across", {v4},
                 [&](std::vector<Value> v) { return std::vector{on_i0(on_i1(on_i0(v[0])))}; })};
    Program half = *c.Trace("i0_half", {v2}, [&](std::vector<Value> v) {
      return std::vector{on_i0_half(on_i0_half(v[0]))};
    });
    Array x4 = *c.Put(F32({0, 0, 0, 0}), i0.info().id, Sharding::Split({4}, 1, 0));
    Array x2 = *c.Put(F32({0, 0}), i0_half.info().id, Sharding::Split({2}, 1, 0));
    std::deque<std::pair<Future<>, std::vector<Array>>> in_flight;
    std::vector<Array> kept;
    auto settle = [&](size_t keep) {
      while (in_flight.size() > keep) {
        Future<> f = in_flight.front().first;
        ASSERT_TRUE(f.AwaitFor(kDeadlockTimeout)) << "deadlock: a run did not finish";
        ASSERT_TRUE(f.status().ok()) << f.status();
        in_flight.pop_front();
        completed++;
      }
    };
    for (int i = 0; i < kRunsPerClient; ++i) {
      const RunOptions mode = rng() % 4 == 0 ? DispatchMode::kSequential : DispatchMode::kParallel;
      std::optional<Array> foreign;
      if (id == 1) {
        pw::MutexLock lock(&mu);
        if (!shared.empty()) {
          foreign = *c.Import(shared.front());
          shared.pop_front();
        }
      }
      const int pick = rng() % 5;
      auto run = foreign.has_value() ? four[0].RunAsync({*foreign}, mode)
                 : pick < 3          ? four[pick].RunAsync({x4}, mode)
                                     : half.RunAsync({x2}, mode);
      ASSERT_TRUE(run.ok()) << run.status();
      if (id == 0 && i % 10 == 0 && pick < 3) {
        auto token = run->first[0].Share();  // Shared as it is made.
        ASSERT_TRUE(token.ok()) << token.status();
        kept.push_back(run->first[0]);  // Until client 1 has imported it (or the end).
        pw::MutexLock lock(&mu);
        shared.push_back(*token);
      }
      in_flight.emplace_back(run->second, std::move(run->first));
      settle(16);
    }
    settle(0);
    auto across = four[2].Run({x4});
    EXPECT_EQ(Values((*across)[0]), (std::vector<float>{21, 21, 21, 21}));
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) threads.emplace_back(client_loop, i);
  for (auto& t : threads) t.join();
  EXPECT_EQ(completed.load(), kClients * kRunsPerClient);
  clients.clear();
  ExpectNothingLeft();
}

// Issue 24: a run on another client's array still being made reaches the schedulers only once
// that array is ready. A policy reorders tenants, so a favoured tenant's run could otherwise go
// ahead of the run making its input and wait for it on the devices, while that run waits for
// the devices (here the window lets one run at a time in flight: it would never end).
TEST(TenantOrderTest, ARunOnAnotherClientsUnfinishedArrayWaitsForItBeforeItsTurn) {
  EmbeddedCluster::Options eo;
  eo.controller.scheduling.window = absl::Nanoseconds(1);  // One run in flight per island.
  auto cluster = *EmbeddedCluster::Create(*ClusterSpec::Uniform(1, 1, 2), eo);
  auto maker = *Client::Connect(&cluster->controller(), "maker", {"slow", 1});
  auto user = *Client::Connect(&cluster->controller(), "user", {"favoured", 1000});
  Slice ms = *maker->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  Slice us = *user->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  NativeFunctionBuilder hb("hold");
  int hx = hb.Input({DType::kF32, Shape({})});
  BoundFunction hold =
      *maker->Pmap(hb.Build({hb.Op("hold_device", {hx}, {{"micros", 50'000}})}), ms);
  BoundFunction make = *maker->Pmap(ReduceAddFn("make"), ms);
  BoundFunction use = *user->Pmap(ReduceAddFn("use"), us);
  Array zero = *maker->Put(F32({0, 0}), ms.info().id, Sharding::Split({2}, 1, 0));
  auto busy = hold.Call({zero});   // In flight: the island's one.
  auto made = make.Call({zero});   // Queued behind it (its tenant's next).
  ASSERT_TRUE(busy.ok() && made.ok());
  Array imported = *user->Import(*(*made)[0].Share());
  auto used = use.Call({imported});  // The favoured tenant's, on the array not yet made.
  ASSERT_TRUE(used.ok());
  Future<> done = (*used)[0].Ready();
  ASSERT_TRUE(done.AwaitFor(kDeadlockTimeout)) << "the run waited on the devices for its input";
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(Values((*used)[0]), (std::vector<float>{3, 3}));  // 0 -> 0+0+1 -> 1+1+1.
}

TEST_P(ClusterTest, NoBufferLeftAfterThousandsOfPrograms) {
  Start(2, 1, 2);
  {
    auto c = Connect("c");
    Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
    BoundFunction f = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
    Program p = *c->Trace("two", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
      return std::vector<Value>{f(f(v[0]))};
    });
    Array x = *c->Put(F32({0, 0}), s.info().id, Sharding::Split({2}, 1, 0));
    std::deque<Future<>> window;
    const int runs = grpc() ? 2000 : 10000;  // Each run is a few RPCs over gRPC.
    for (int i = 0; i < runs; ++i) {
      auto r = p.RunAsync({x});  // Outputs dropped at once.
      ASSERT_TRUE(r.ok()) << r.status();
      window.push_back(r->second);
      if (window.size() > 64) {
        ASSERT_TRUE(window.front().status().ok());
        window.pop_front();
      }
    }
    for (auto& f : window) ASSERT_TRUE(f.status().ok());
    EXPECT_EQ(controller().Status().value().runs_completed, runs);
  }
  ExpectNothingLeft();
}

TEST_P(ClusterTest, BackPressureWaitsForMemoryAndNeverFitFails) {
  Start(1, 1, 2, /*memory=*/16);  // Room for four f32 scalars per device.
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction f = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
  Array x = *c->Put(F32({0, 0}), s.info().id, Sharding::Split({2}, 1, 0));  // 4 bytes/device
  std::vector<Array> held;
  for (int i = 0; i < 3; ++i) held.push_back((*f.Call({x}))[0]);  // 16 bytes/device: full.
  for (auto& h : held) ASSERT_TRUE(h.Ready().status().ok());
  auto blocked = f.Call({x});
  ASSERT_TRUE(blocked.ok()) << "a run that does not fit yet waits, it does not fail";
  Future<> ready = (*blocked)[0].Ready();
  EXPECT_FALSE(ready.AwaitFor(absl::Milliseconds(200)));
  size_t waiters = 0;
  const absl::Time deadline = absl::Now() + kDeadlockTimeout;
  while (true) {  // Until both devices' reservations wait.
    waiters = 0;
    const std::vector<HostStatus> hosts = StatusOfEveryHost(controller()).value().hosts;
    for (const auto& h : hosts)
      for (const auto& d : h.devices) waiters += d.memory_waiters;
    if (waiters == 2 || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(waiters, 2u);
  // Status lists the waiting run (through the transport under test). In process the caller owns
  // the cluster and sees its program; over gRPC a client's view names no program (only the
  // cluster token's holder sees them: issue 20, Status listed every client's programs).
  ClusterStatus st = api()->Status().value();
  ASSERT_EQ(st.running.size(), 1u);
  EXPECT_EQ(st.running[0].client, c->id());
  if (grpc()) EXPECT_EQ(st.running[0].program, "");
  else EXPECT_TRUE(absl::StrContains(st.running[0].program, "inc")) << st.running[0].program;
  held.pop_back();  // Frees 4 bytes per device.
  ASSERT_TRUE(ready.AwaitFor(kDeadlockTimeout));
  EXPECT_EQ(Values((*blocked)[0]), (std::vector<float>{1, 1}));

  // A program whose values can never fit in a device fails at once, naming it.
  BoundFunction big = *c->Pmap(ScalarFn("big", "add_scalar", 1, DType::kF32, Shape({8})), s);
  Array bx = *c->Put(HostArray{{DType::kF32, Shape({2, 8})}, Bytes(64, 0)},
                     s.info().id, Sharding::Split({2}, 2, 0));
  EXPECT_EQ(bx.Ready().status().code(), absl::StatusCode::kResourceExhausted);
  auto never = big.Call({bx});
  EXPECT_EQ(never.status().code(), absl::StatusCode::kResourceExhausted) << never.status();
  EXPECT_NE(never.status().message().find("device:"), std::string::npos);
}

// Issue 23 item 5: a host fails and rejoins the same way in the embedded cluster as on a process
// cluster. Failing first in process, where nothing could fail a host: and with FailHost taking
// the worker out of service without Worker::Fail, the run waiting for memory on it never ended.
TEST_P(ClusterTest, AFailedHostsWorkFailsNamingItAndARestartedHostServesAgain) {
  Start(1, 2, 2, /*memory=*/16);  // Room for four f32 scalars per device.
  auto c = Connect("drill");
  Slice all = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
  BoundFunction reduce = *c->Pmap(ReduceAddFn("reduce"), all);
  Array x = *c->Put(F32({1, 2, 3, 4}), all.info().id, Sharding::Split({4}, 1, 0));
  auto reader = Connect("reader");
  const std::string token = *x.Share();
  Array imported = *reader->Import(token);
  std::vector<Array> held;
  for (int i = 0; i < 3; ++i) held.push_back((*reduce.Call({x}))[0]);  // Every device full.
  EXPECT_EQ(Values(held[0]), (std::vector<float>{11, 11, 11, 11}));
  auto blocked = reduce.Call({x});
  ASSERT_TRUE(blocked.ok()) << blocked.status();
  size_t waiters = 0;
  const absl::Time deadline = absl::Now() + kDeadlockTimeout;
  while (true) {  // Until every device's reservation waits: the run is on both hosts.
    waiters = 0;
    const ClusterStatus st = StatusOfEveryHost(controller()).value();
    for (const auto& h : st.hosts)
      for (const auto& d : h.devices) waiters += d.memory_waiters;
    if (waiters == 4 || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(waiters, 4u);

  FailHost(HostId(1));
  {  // The status lists it as failed, and why, in both modes (pw status, pathways.status()).
    const ClusterStatus st = controller().Status().value();
    ASSERT_EQ(st.failed_hosts.size(), 1u);
    EXPECT_EQ(st.failed_hosts[0].host, HostId(1));
    EXPECT_THAT(st.failed_hosts[0].reason,
                HasSubstr(grpc() ? "host:1 is stopping" : "by the test"));
  }
  // The run in flight fails naming the host, once host 0's part has its memory.
  held.pop_back();
  Future<> ready = (*blocked)[0].Ready();
  ASSERT_TRUE(ready.AwaitFor(kDeadlockTimeout)) << "a run on a failed host never ended";
  EXPECT_THAT(ready.status().message(), HasSubstr("host:1")) << ready.status();
  blocked = absl::UnknownError("dropped");
  // Its shards are lost, new runs on its devices fail naming it, and its devices cannot be
  // allocated; host 0 serves on.
  EXPECT_THAT(x.ToHost().status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("host:1 failed")));
  EXPECT_THAT(CallStatus(reduce.Call({x})).message(), HasSubstr("host:1 failed"));
  EXPECT_FALSE(c->MakeVirtualDeviceSet().AddSlice({.num_devices = 4}).ok());
  // A share of a lost array still ends: the importer's handle goes (seen failing: the revoke
  // skipped it, as its lookup now failed, and the reader kept a lost array).
  EXPECT_THAT(imported.ToHost().status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("lost")));
  ASSERT_TRUE(c->Revoke(token).ok());
  EXPECT_THAT(imported.ToHost().status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not an array of this client")));
  held.clear();
  Slice two = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  for (DeviceId d : two.info().devices) EXPECT_LT(d.value(), 2);
  BoundFunction reduce2 = *c->Pmap(ReduceAddFn("reduce2"), two);
  EXPECT_EQ(Values((*reduce2.Call({*c->Put(F32({1, 2}), two.info().id,
                                           Sharding::Split({2}, 1, 0))}))[0]),
            (std::vector<float>{4, 4}));

  // Restarted, it serves the slice it served before (its functions loaded again), holding none
  // of what the failed worker held.
  RestartHost(HostId(1));
  EXPECT_TRUE(controller().Status().value().failed_hosts.empty());
  Array x2 = *c->Put(F32({1, 1, 1, 1}), all.info().id, Sharding::Split({4}, 1, 0));
  EXPECT_EQ(Values((*reduce.Call({x2}))[0]), (std::vector<float>{5, 5, 5, 5}));
  // What it held stays lost (seen failing on every transport: a read of it waited forever for a
  // shard the new worker would never make).
  Future<HostArray> read = x.ToHostAsync();
  ASSERT_TRUE(read.AwaitFor(kDeadlockTimeout)) << "a read of a lost array never ended";
  EXPECT_THAT(read.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("was lost")));
  auto rerun = reduce.Call({x});
  ASSERT_TRUE(!rerun.ok() || rerun->front().Ready().AwaitFor(kDeadlockTimeout));
  EXPECT_THAT(CallStatus(rerun), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("was lost")));
  x = x2 = imported = Array();
  rerun = absl::UnknownError("dropped");
  ExpectNothingLeft();
}

// A cluster's only host fails and restarts: its collectives meet again (seen failing embedded,
// where the hosts share one Collectives and nothing else was left to take its devices back).
// Issue 23 item 5: each host has a communicator of its own (in process too), so when a host
// fails while another host's shards wait inside a collective with it, something must end their
// wait: the controller's RemoveDevice to every worker. They fail naming the host, long before
// the collective timeout (5 minutes).
TEST_P(ClusterTest, AHostFailingEndsTheCollectiveItsPeersWaitIn) {
  Start(1, 2, 2, /*memory=*/16);  // Room for four f32 scalars per device.
  auto c = Connect("c");
  Slice all = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
  Slice on1 = *c->MakeVirtualDeviceSet().AddSlice(
      {.num_devices = 2, .placement = SlicePlacement::kHost, .hosts = {HostId(1)}});
  BoundFunction reduce = *c->Pmap(ReduceAddFn("reduce"), all);
  Array x = *c->Put(F32({1, 2, 3, 4}), all.info().id, Sharding::Split({4}, 1, 0));
  std::vector<Array> fill;  // Host 1's devices full: its shards of the run wait for memory.
  for (int i = 0; i < 3; ++i)
    fill.push_back(*c->Put(F32({0, 0}), on1.info().id, Sharding::Split({2}, 1, 0)));
  auto waits = reduce.Call({x});  // Host 0's shards go into the all-reduce and wait for host 1's.
  ASSERT_TRUE(waits.ok()) << waits.status();
  const absl::Time deadline = absl::Now() + kDeadlockTimeout;
  size_t waiters = 0;
  while (waiters != 2 && absl::Now() < deadline) {
    waiters = 0;
    const ClusterStatus st = StatusOfEveryHost(controller()).value();
    for (const auto& h : st.hosts)
      for (const auto& d : h.devices) waiters += d.memory_waiters;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(waiters, 2u);
  FailHost(HostId(1));
  Future<> ready = (*waits)[0].Ready();
  ASSERT_TRUE(ready.AwaitFor(kDeadlockTimeout)) << "a collective with a failed host never ended";
  EXPECT_THAT(ready.status().message(), HasSubstr("host:1")) << ready.status();
  EXPECT_NE(ready.status().code(), absl::StatusCode::kDeadlineExceeded);  // Not the timeout.
  x = Array();
  fill.clear();
}

TEST_P(ClusterTest, ARestartedOnlyHostRunsCollectivesAgain) {
  Start(1, 1, 2);
  auto c = Connect("alone");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction reduce = *c->Pmap(ReduceAddFn("reduce"), s);
  const Sharding split = Sharding::Split({2}, 1, 0);
  EXPECT_EQ(Values((*reduce.Call({*c->Put(F32({1, 2}), s.info().id, split)}))[0]),
            (std::vector<float>{4, 4}));
  FailHost(HostId(0));
  RestartHost(HostId(0));
  Future<HostArray> out =
      (*reduce.Call({*c->Put(F32({2, 3}), s.info().id, split)}))[0].ToHostAsync();
  ASSERT_TRUE(out.AwaitFor(kDeadlockTimeout));
  ASSERT_TRUE(out.status().ok()) << out.status();
  EXPECT_EQ(out.Await()->values<float>(), (std::vector<float>{6, 6}));
}

// Issue 20 item 7: a run that could not finish held its client and its devices forever. With a
// timeout, its client sees DEADLINE_EXCEEDED naming it and the timeout, and its devices serve
// the next run; an admin cancels a client's runs the same way (seen failing: the next run
// waited behind the memory the cancelled run's outputs still reserved).
TEST_P(ClusterTest, RunsOverTheirTimeoutOrCancelledEndAtOnceAndTheDevicesServeTheNext) {
  Start(1, 1, 2, /*memory=*/16);  // Room for four f32 scalars per device.
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction f = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
  Array x = *c->Put(F32({0, 0}), s.info().id, Sharding::Split({2}, 1, 0));  // 4 bytes/device
  std::vector<Array> held;
  for (int i = 0; i < 3; ++i) held.push_back((*f.Call({x}))[0]);  // 16 bytes/device: full.
  for (auto& h : held) ASSERT_TRUE(h.Ready().status().ok());

  RunOptions timed;
  timed.timeout = absl::Milliseconds(50);
  auto blocked = f.Call({x}, timed);  // Waits for memory that nothing frees.
  ASSERT_TRUE(blocked.ok()) << blocked.status();
  Future<> ready = (*blocked)[0].Ready();
  ASSERT_TRUE(ready.AwaitFor(kDeadlockTimeout));
  EXPECT_EQ(ready.status().code(), absl::StatusCode::kDeadlineExceeded) << ready.status();
  EXPECT_THAT(std::string(ready.status().message()),
              ::testing::HasSubstr("overran its timeout of 50ms and was cancelled"));
  EXPECT_EQ((*blocked)[0].ToHost().status().code(), absl::StatusCode::kDeadlineExceeded);
  // The cancelled run does not hold the devices: the next run takes the memory freed.
  held.pop_back();
  auto next = f.Call({x});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Values((*next)[0]), (std::vector<float>{1, 1}));

  // Full again; the admin cancels the client's waiting run.
  held.push_back((*next)[0]);
  auto waiting = f.Call({x});
  ASSERT_TRUE(waiting.ok());
  ASSERT_FALSE((*waiting)[0].devices().empty());  // Accepted (known to the controller).
  std::vector<RunId> cancelled =
      controller().CancelClientRuns(c->id(), absl::CancelledError("cancelled by the test"));
  EXPECT_EQ(cancelled.size(), 1u);
  Future<> w = (*waiting)[0].Ready();
  ASSERT_TRUE(w.AwaitFor(kDeadlockTimeout));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kCancelled) << w.status();
  EXPECT_EQ(controller().CancelRun(RunId(12345), absl::CancelledError("x")).code(),
            absl::StatusCode::kNotFound);
  held.clear();
  blocked = absl::InternalError("dropped");
  waiting = absl::InternalError("dropped");
  next = absl::InternalError("dropped");
  x = Array();
  ExpectNothingLeft();
}

TEST_P(ClusterTest, ChainLongerThanMemoryRunsBecauseIntermediatesAreReleased) {
  Start(1, 1, 2, /*memory=*/16);  // Room for four f32 scalars per device.
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction inc = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
  // 50 intermediates per device; at most two are alive at once.
  Program chain = *c->Trace("chain", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    Value x = v[0];
    for (int i = 0; i < 50; ++i) x = inc(x);
    return std::vector<Value>{x};
  });
  Array x = *c->Put(F32({0, 10}), s.info().id, Sharding::Split({2}, 1, 0));
  // Parallel dispatch hands the intermediates from node to node; sequential dispatch (a node per
  // message) keeps them in the object store. Both release them as the chain runs.
  for (DispatchMode mode : {DispatchMode::kParallel, DispatchMode::kSequential}) {
    for (int run = 0; run < 3; ++run) {
      auto out = chain.Run({x}, mode);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(Values((*out)[0]), (std::vector<float>{50, 60})) << DispatchModeName(mode);
    }
  }
  x = Array();
  ExpectNothingLeft();
}

// A chain's intermediates need memory for the most of them alive at once (a segment reserves
// that before its first node makes one): while it is held elsewhere the chain waits, and it
// completes once it is freed.
TEST_P(ClusterTest, ChainWaitsForMemoryForItsIntermediates) {
  Start(1, 1, 2, /*memory=*/16);  // Room for four f32 scalars per device.
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction inc = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
  Program chain = *c->Trace("chain3", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    return std::vector<Value>{inc(inc(inc(v[0])))};
  });
  Array x = *c->Put(F32({0, 10}), s.info().id, Sharding::Split({2}, 1, 0));  // 4 bytes/device
  for (DispatchMode mode : {DispatchMode::kParallel, DispatchMode::kSequential}) {
    std::vector<Array> held;
    for (int i = 0; i < 3; ++i) held.push_back((*inc.Call({x}))[0]);  // 16 bytes/device: full.
    for (auto& h : held) ASSERT_TRUE(h.Ready().status().ok());
    auto out = chain.Run({x}, mode);
    ASSERT_TRUE(out.ok()) << out.status();
    Future<> ready = (*out)[0].Ready();
    EXPECT_FALSE(ready.AwaitFor(absl::Milliseconds(200))) << DispatchModeName(mode);
    held.clear();
    ASSERT_TRUE(ready.AwaitFor(kDeadlockTimeout)) << DispatchModeName(mode);
    EXPECT_EQ(Values((*out)[0]), (std::vector<float>{3, 13})) << DispatchModeName(mode);
  }
  x = Array();
  ExpectNothingLeft();
}

// Status counts computations, however the devices' queues hold them (a segment runs a work's
// nodes on a device as one item).
TEST_P(ClusterTest, StatusCountsEveryComputationRun) {
  Start(1, 1, 2);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction inc = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
  constexpr int kNodes = 20;
  Program chain = *c->Trace("chain", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    Value x = v[0];
    for (int i = 0; i < kNodes; ++i) x = inc(x);
    return std::vector<Value>{x};
  });
  Array x = *c->Put(F32({0, 0}), s.info().id, Sharding::Split({2}, 1, 0));
  auto executed = [&] {
    std::vector<int64_t> n;
    const ClusterStatus status = StatusOfEveryHost(controller()).value();
    for (const HostStatus& h : status.hosts)
      for (const DeviceStatus& d : h.devices) n.push_back(d.executed);
    return n;
  };
  for (DispatchMode mode : {DispatchMode::kParallel, DispatchMode::kSequential}) {
    const std::vector<int64_t> before = executed();
    auto out = chain.Run({x}, mode);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Values((*out)[0]), (std::vector<float>{kNodes, kNodes}));
    controller().WaitIdle();
    const std::vector<int64_t> after = executed();
    ASSERT_EQ(after.size(), 2u);
    for (size_t i = 0; i < after.size(); ++i)
      EXPECT_EQ(after[i] - before[i], kNodes) << DispatchModeName(mode) << " device " << i;
  }
}

TEST_P(ClusterTest, FailedChainLeavesNoIntermediateBehind) {
  Start(1, 1, 2);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction inc = *c->Pmap(ScalarFn("inc", "add_scalar", 1, DType::kS32), s);
  BoundFunction divide = *c->Pmap(BinaryFn("div", DType::kS32), s);
  // Shard 1 fails in the middle of the chain; the nodes after it fail on that device.
  Program p = *c->Trace("chain", {{DType::kS32, Shape({2})}, {DType::kS32, Shape({2})}},
                        [&](std::vector<Value> v) {
                          Value x = inc(v[0]);
                          x = divide({inc(x), v[1]})[0];
                          for (int i = 0; i < 5; ++i) x = inc(x);
                          return std::vector<Value>{x};
                        });
  auto put = [&](std::vector<int32_t> v) {
    return *c->Put(*HostArray::Of<int32_t>(DType::kS32, Shape({2}), v), s.info().id,
                   Sharding::Split({2}, 1, 0));
  };
  Array x = put({4, 4}), bad = put({2, 0});
  for (DispatchMode mode : {DispatchMode::kParallel, DispatchMode::kSequential}) {
    auto out = p.Run({x, bad}, mode);
    ASSERT_TRUE(out.ok()) << out.status();
    Future<> ready = (*out)[0].Ready();
    ASSERT_TRUE(ready.AwaitFor(kDeadlockTimeout));
    EXPECT_NE(ready.status().message().find("division by zero"), std::string::npos)
        << DispatchModeName(mode) << ": " << ready.status();
  }
  x = Array();
  bad = Array();
  ExpectNothingLeft();
}

// Parallel dispatch hands a chain's intermediates from node to node on each device without the
// store (kept by the device's segment when the nodes run on launch); every reader gets the
// value, including a node that reads it twice and the last reader, which takes it.
TEST_P(ClusterTest, IntermediateReadByManyNodesReachesEveryReader) {
  Start(1, 1, 2);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction inc = *c->Pmap(ScalarFn("inc", "add_scalar", 1, DType::kS32), s);
  BoundFunction add = *c->Pmap(BinaryFn("add", DType::kS32), s);
  Program p = *c->Trace("fan", {{DType::kS32, Shape({2})}}, [&](std::vector<Value> v) {
    Value y = inc(v[0]);            // Read by the next three nodes.
    Value first = inc(y);           // y + 1
    Value twice = add({y, y})[0];   // 2y, reading y twice
    Value last = add({first, y})[0];  // 2y + 1: y's last read
    return std::vector<Value>{add({twice, last})[0]};  // 4y + 1
  });
  Array x = *c->Put(*HostArray::Of<int32_t>(DType::kS32, Shape({2}), {4, 10}), s.info().id,
                    Sharding::Split({2}, 1, 0));
  for (DispatchMode mode : {DispatchMode::kParallel, DispatchMode::kSequential}) {
    for (int i = 0; i < 3; ++i) {
      auto out = p.Run({x}, mode);
      ASSERT_TRUE(out.ok()) << out.status();
      auto fan = (*out)[0].ToHost();
      ASSERT_TRUE(fan.ok()) << DispatchModeName(mode) << ": " << fan.status();
      EXPECT_EQ(fan->values<int32_t>(), (std::vector<int32_t>{21, 45})) << DispatchModeName(mode);
    }
  }
  x = Array();
  ExpectNothingLeft();
}

TEST_P(ClusterTest, DeviceRemovalMidRunFailsOnlyAffectedPrograms) {
  Start(1, 2, 2);
  auto c = Connect("c");
  auto set = c->MakeVirtualDeviceSet();
  Slice all = *set.AddSlice({.num_devices = 4});
  BoundFunction step = *c->Pmap(ReduceAddFn("step"), all);
  Program longp = *c->Trace("long", {{DType::kF32, Shape({4})}}, [&](std::vector<Value> v) {
    Value x = v[0];
    for (int i = 0; i < 3000; ++i) x = step(x);
    return std::vector<Value>{x};
  });
  Array x = *c->Put(F32({0, 0, 0, 0}), all.info().id, Sharding::Split({4}, 1, 0));
  auto run = longp.RunAsync({x});
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(controller().RemoveDevice(DeviceId(3), "test: pulled mid-run").Await().ok());
  ASSERT_TRUE(run->second.AwaitFor(kDeadlockTimeout)) << "run hung after device removal";
  absl::Status s = run->second.status();
  // The run either finished before the removal or failed naming the device.
  if (!s.ok()) {
    EXPECT_NE(s.message().find("device:3"), std::string::npos) << s;
  }
  std::fprintf(stderr, "long run after removal: %s\n", s.ToString().c_str());
  // New runs on the slice fail at once, naming the device.
  EXPECT_FALSE(CallStatus(longp.Run({x})).ok());
  absl::Status direct = CallStatus(step.Call({x}));
  ASSERT_FALSE(direct.ok());
  EXPECT_THAT(direct.message(), ::testing::HasSubstr("device:3"));
  // Programs on devices that remain keep running; new slices avoid the removed device.
  Slice rest = *set.AddSlice({.num_devices = 3});
  for (DeviceId d : rest.info().devices) EXPECT_NE(d, DeviceId(3));
  BoundFunction ok_step = *c->Pmap(ReduceAddFn("ok"), rest);
  Array y = *c->Put(F32({1, 1, 1}), rest.info().id, Sharding::Split({3}, 1, 0));
  EXPECT_EQ(Values((*ok_step.Call({y}))[0]), (std::vector<float>{4, 4, 4}));
  EXPECT_FALSE(set.AddSlice({.num_devices = 4}).ok());
  // A host added at run time brings devices that can be allocated again. (Over gRPC, hosts are
  // the spec's; a rejoining worker is tested in pw/server/cluster_test.cc.)
  if (grpc()) return;
  auto added = embedded_for_test()->AddHost(IslandId(0), 2);
  ASSERT_TRUE(added.ok()) << added.status();
  Slice grown = *set.AddSlice({.num_devices = 5});
  BoundFunction g = *c->Pmap(ReduceAddFn("grown"), grown);
  Array z = *c->Put(F32({1, 1, 1, 1, 1}), grown.info().id, Sharding::Split({5}, 1, 0));
  EXPECT_EQ(Values((*g.Call({z}))[0]), (std::vector<float>{6, 6, 6, 6, 6}));
}

// Issue 20, item 5: a Value kept past its trace held a pointer to the stack-local Tracer, so a
// later trace using it crashed or, at the same stack depth, was silently wired to the wrong node.
// Traces are named by identity now: the later trace fails, naming the node.
TEST_P(ClusterTest, AValueKeptFromAnEndedTraceIsRefusedNamingTheNode) {
  Start(1, 1, 2);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction f = *c->Pmap(ScalarFn("f", "mul_scalar", 2), s);
  std::optional<Value> kept;
  auto first = c->Trace("first", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    kept = f(v[0]);
    return std::vector<Value>{*kept};
  });
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = c->Trace("second", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    return std::vector<Value>{f(*kept)};  // Same stack depth as the first trace's values.
  });
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(
                "tracing program 'second': node 'f' input 0 comes from another trace"),
            std::string::npos)
      << second.status();
  EXPECT_TRUE(f(std::vector<Value>{*kept}).empty());  // Outside any trace: nothing recorded.
  auto out = first->Call({F32({1, 2})});  // The first program still runs.
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].ToHost()->values<float>(), (std::vector<float>{2, 4}));
}

TEST_P(ClusterTest, BadInputsGetClearErrorsAndTheRuntimeKeepsServing) {
  Start(2, 1, 2);
  auto a = Connect("a");
  auto b = Connect("b");
  Slice sa = *a->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  Slice sb = *b->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction fa = *a->Pmap(ScalarFn("fa", "mul_scalar", 2), sa);
  BoundFunction fb = *b->Pmap(ScalarFn("fb", "mul_scalar", 2), sb);
  Array xa = *a->Put(F32({1, 2}), sa.info().id, Sharding::Split({2}, 1, 0));
  Array xb = *b->Put(F32({1, 2}), sb.info().id, Sharding::Split({2}, 1, 0));
  ControllerInterface& ctl = *api();

  // Unknown kernel: the error names the function, op and kernel.
  auto bad_fn = a->Register(ScalarFn("oops", "no_such_kernel", 1));
  EXPECT_EQ(bad_fn.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(bad_fn.status().message().find("function 'oops' op 0 (no_such_kernel)"),
            std::string::npos);
  // Foreign handle as an argument.
  absl::Status foreign = CallStatus(fa.Call({xb}));
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound) << foreign;
  EXPECT_THAT(foreign.message(), ::testing::HasSubstr("argument 0"));
  // Another client's buffer cannot be read or released.
  EXPECT_EQ(ctl.FetchArray(a->id(), xb.id()).status().code(), absl::StatusCode::kNotFound);
  // (In process the release says NotFound; over the wire it travels on a's session and is
  // ignored there. Either way xb lives on: b uses it below, after a's later calls.)
  absl::Status foreign_release = ctl.ReleaseArray(a->id(), xb.id());
  EXPECT_TRUE(foreign_release.ok() || absl::IsNotFound(foreign_release)) << foreign_release;
  // Another client's function cannot be bound.
  EXPECT_EQ(ctl.LoadFunction(a->id(), fb.binding().function, sa.info().id).status().code(),
            absl::StatusCode::kNotFound);
  // Unknown program and released handle.
  EXPECT_EQ(ctl.Submit(a->id(), ProgramId(999), {}, DispatchMode::kParallel).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ctl.Submit(a->id(), ProgramId(0), {BufferId(12345)}, DispatchMode::kParallel)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  // Unknown client.
  EXPECT_EQ(ctl.AllocateSlice(ClientId(77), {.num_devices = 1}).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Shape mismatch between traced nodes, caught while tracing, naming the node.
  BoundFunction wide = *a->Pmap(ScalarFn("wide", "neg", 0, DType::kF32, Shape({3})), sa);
  auto mismatch = a->Trace("mm", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    return std::vector<Value>{wide(fa(v[0]))};
  });
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("node 'wide' input 0 expects f32[2,3]"),
            std::string::npos) << mismatch.status();
  // The same mismatch sent straight to the controller is caught there too.
  ProgramIr ir{"raw", {{DType::kF32, Shape({2})}},
               {{"fa", fa.binding(), {{ValueRef::kArgNode, 0}}}, {"wide", wide.binding(), {{0, 0}}}},
               {{1, 0}}};
  EXPECT_NE(ctl.RegisterProgram(a->id(), ir).status().message().find("node 'wide' input 0"),
            std::string::npos);
  // A cycle.
  ProgramIr cyc{"cyc", {{DType::kF32, Shape({2})}},
                {{"r", fa.binding(), {{ValueRef::kArgNode, 0}}},
                 {"p", fa.binding(), {{2, 0}}},
                 {"q", fa.binding(), {{1, 0}}}},
                {{2, 0}}};
  auto cs = ctl.RegisterProgram(a->id(), cyc).status();
  EXPECT_TRUE(absl::StrContains(cs.message(), "cycle: 'p' -> 'q' -> 'p'") ||
              absl::StrContains(cs.message(), "cycle: 'q' -> 'p' -> 'q'"))
      << cs;
  // A program on another client's slice.
  ProgramIr stolen{"stolen", {{DType::kF32, Shape({2})}},
                   {{"f", fb.binding(), {{ValueRef::kArgNode, 0}}}}, {{0, 0}}};
  EXPECT_FALSE(ctl.RegisterProgram(a->id(), stolen).ok());
  // Bad arrays.
  EXPECT_FALSE(a->Put(HostArray{{DType::kF32, Shape({2})}, Bytes(3, 0)},
                      sa.info().id, Sharding::Split({2}, 1, 0)).ok());
  EXPECT_FALSE(a->Put(F32({1, 2, 3}), sa.info().id, Sharding::Split({2}, 1, 0)).ok());
  // A run-time kernel error fails the run, naming the node, and later runs are fine.
  BoundFunction div0 = *a->Pmap(ScalarFn("div0", "div_scalar", 0, DType::kS32, Shape({})), sa);
  Array ia = *a->Put(*HostArray::Of<int32_t>(DType::kS32, Shape({2}), {1, 2}), sa.info().id,
                     Sharding::Split({2}, 1, 0));
  auto failed = div0.Call({ia});
  ASSERT_TRUE(failed.ok());
  absl::Status fs = (*failed)[0].Ready().status();
  EXPECT_EQ(fs.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fs.message().find("node 'div0'"), std::string::npos) << fs;
  EXPECT_EQ((*failed)[0].ToHost().status().code(), absl::StatusCode::kInvalidArgument);
  // Released slice.
  ASSERT_TRUE(sa.Release().ok());
  EXPECT_THAT(CallStatus(fa.Call({xa})).message(), ::testing::HasSubstr("released"));
  // The runtime keeps serving: client b and a new Figure 2 both work.
  EXPECT_EQ(Values((*fb.Call({xb}))[0]), (std::vector<float>{2, 4}));
  auto fig = RunFigure2(api());
  ASSERT_TRUE(fig.ok()) << fig.status();
  EXPECT_EQ(fig->ToString(), "(array([3., 5.]), array([2., 4.]))");
}

// One shard fails (integer division by zero on one device only) before a collective that the other
// shard reaches: the other shard must not wait forever, in the same node or the next one.
TEST_P(ClusterTest, ShardFailingBeforeACollectiveDoesNotHangTheOthers) {
  Start(1, 1, 2);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  ArraySpec s32{DType::kS32, Shape({})};
  NativeFunctionBuilder fused("div_then_reduce");
  int x = fused.Input(s32), d = fused.Input(s32);
  int q = fused.Op("div", {x, d});
  BoundFunction div_reduce = *c->Pmap(fused.Build({fused.Op("all_reduce_sum", {q})}), s);
  BoundFunction divide = *c->Pmap(BinaryFn("div", DType::kS32), s);
  NativeFunctionBuilder red("reduce");
  int r = red.Input(s32);
  BoundFunction reduce = *c->Pmap(red.Build({red.Op("all_reduce_sum", {r})}), s);
  auto put = [&](std::vector<int32_t> v) {
    return *c->Put(*HostArray::Of<int32_t>(DType::kS32, Shape({2}), v), s.info().id,
                   Sharding::Split({2}, 1, 0));
  };
  Array x4 = put({4, 4}), bad = put({2, 0}), good = put({2, 1});
  // Same node: shard 1 fails at op 0, shard 0 waits at op 1.
  auto one = div_reduce.Call({x4, bad});
  ASSERT_TRUE(one.ok());
  Future<> f1 = (*one)[0].Ready();
  ASSERT_TRUE(f1.AwaitFor(kDeadlockTimeout)) << "a shard hung in a collective";
  EXPECT_NE(f1.status().message().find("division by zero"), std::string::npos) << f1.status();
  // Next node: shard 1's input failed, shard 0's did not.
  Program p = *c->Trace("two", {{DType::kS32, Shape({2})}, {DType::kS32, Shape({2})}},
                        [&](std::vector<Value> v) {
                          return std::vector<Value>{reduce(divide({v[0], v[1]})[0])};
                        });
  auto two = p.Run({x4, bad});
  ASSERT_TRUE(two.ok());
  Future<> f2 = (*two)[0].Ready();
  ASSERT_TRUE(f2.AwaitFor(kDeadlockTimeout)) << "a shard hung in the next node's collective";
  EXPECT_FALSE(f2.status().ok());
  // The devices keep serving.
  auto ok = div_reduce.Call({x4, good});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[0].ToHost()->values<int32_t>(), (std::vector<int32_t>{6, 6}));
}

TEST_P(ClusterTest, FetchAfterReleasingTheHandleStillCompletes) {
  Start(1, 1, 2);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction f = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
  Array x = *c->Put(F32({1, 2}), s.info().id, Sharding::Split({2}, 1, 0));
  Array y = (*f.Call({x}))[0];
  Future<HostArray> fetched = y.ToHostAsync();
  y = Array();  // Dropped while the run and the fetch may still be in flight.
  ASSERT_TRUE(fetched.AwaitFor(kDeadlockTimeout));
  ASSERT_TRUE(fetched.status().ok()) << fetched.status();
  EXPECT_EQ(fetched.Await()->values<float>(), (std::vector<float>{2, 3}));
  x = Array();
  ExpectNothingLeft();
}

// Issue 23: calls are pipelined: a run's outputs have ids the client chose, so the next call
// uses them before the controller has answered (over the wire nothing waits for it). A chain
// of calls sent at once computes what it would one by one, also when the controller may hold
// only two of the client's runs at a time (it stops reading the session meanwhile); a refused
// call fails its outputs, and a call already sent with one of them fails naming why.
TEST_P(ClusterTest, PipelinedCallsUseOutputsBeforeTheControllerAnswers) {
  runs_in_flight_limit_ = 2;
  Start(1, 2, 2);
  auto c = Connect("c");
  Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
  BoundFunction inc = *c->Pmap(ReduceAddFn("inc"), s);  // x -> sum over shards + 1.
  Array x = *c->Put(F32({0, 0, 0, 0}), s.info().id, Sharding::Split({4}, 1, 0));
  std::vector<Future<>> ends;
  Array y = x;
  for (int i = 0; i < 50; ++i) {
    auto r = inc.Call({y});
    ASSERT_TRUE(r.ok()) << r.status();
    y = (*r)[0];
    ends.push_back(y.Ready());
  }
  // sum(4 * v) + 1 from 0: 1, 5, 21, ... — checked on the host in float, as the kernel adds.
  float want = 0;
  for (int i = 0; i < 50; ++i) want = 4 * want + 1;
  EXPECT_EQ(Values(y), std::vector<float>(4, want));
  for (auto& e : ends) EXPECT_TRUE(e.status().ok()) << e.status();
  EXPECT_EQ(y.devices().size(), 4u);
  // A refused run (its slice is gone) and a call sent with its output before the answer.
  Slice gone = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction on_gone = *c->Pmap(ScalarFn("dbl", "mul_scalar", 2), gone);
  Array z = *c->Put(F32({1, 2}), gone.info().id, Sharding::Split({2}, 1, 0));
  BoundFunction again = *c->Pmap(ScalarFn("dbl2", "mul_scalar", 2), gone);
  ASSERT_TRUE(gone.Release().ok());
  absl::StatusOr<std::vector<Array>> refused = on_gone.Call({z});
  absl::Status first = CallStatus(refused);
  EXPECT_THAT(first.message(), ::testing::HasSubstr("released")) << first;
  if (refused.ok()) {  // Over the wire: the refusal reaches its outputs and their users.
    EXPECT_FALSE((*refused)[0].ToHost().ok());
    EXPECT_TRUE((*refused)[0].devices().empty());
    absl::Status second = CallStatus(again.Call({(*refused)[0]}));
    EXPECT_THAT(second.message(), ::testing::HasSubstr("was not made")) << second;
    EXPECT_THAT(second.message(), ::testing::HasSubstr("released")) << second;
    refused = absl::CancelledError("dropped");  // The handles go; nothing stays behind.
  }
  ends.clear();
  x = y = z = Array();
  ExpectNothingLeft();
}

// A shared service: a client's functions and programs stay until it leaves, so one client
// registering without end would grow the controller until it failed. Past its limits a
// registration is refused over either transport, naming the flag; another client has its own.
TEST_P(ClusterTest, AClientsFunctionsAndProgramsStayWithinItsLimits) {
  definitions_ = {.max_functions = 2, .max_programs = 2};
  Start(1, 1, 2);
  auto a = Connect("a"), b = Connect("b");
  Slice s = *a->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction f = *a->Pmap(ScalarFn("inc", "add_scalar", 1), s);
  ASSERT_TRUE(a->Pmap(ScalarFn("dec", "add_scalar", -1), s).ok());
  auto third = a->Pmap(ScalarFn("twice", "mul_scalar", 2), s);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_THAT(std::string(third.status().message()),
              ::testing::AllOf(::testing::HasSubstr("function 'twice' was not registered"),
                               ::testing::HasSubstr("--max-client-functions")));
  // Programs: calling a function directly registers one (its one-node program), and so does
  // each trace.
  Array x = *a->Put(F32({1, 2}), s.info().id, Sharding::Split({2}, 1, 0));
  EXPECT_EQ(Values((*f.Call({x}))[0]), (std::vector<float>{2, 3}));
  const ArraySpec global{DType::kF32, Shape({2})};
  auto trace = [&](const std::string& name) {
    return a->Trace(name, {global},
                    [&](std::vector<Value> v) { return std::vector<Value>{f(f(v[0]))}; });
  };
  ASSERT_TRUE(trace("two").ok());
  auto third_program = trace("again");
  EXPECT_EQ(third_program.status().code(), absl::StatusCode::kResourceExhausted)
      << third_program.status();
  EXPECT_THAT(std::string(third_program.status().message()),
              ::testing::AllOf(::testing::HasSubstr("program 'again' was not registered"),
                               ::testing::HasSubstr("--max-client-programs")));
  // The refusals cost the client nothing it had.
  EXPECT_EQ(Values((*f.Call({x}))[0]), (std::vector<float>{2, 3}));
  // Another client's limits are its own.
  Slice sb = *b->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  EXPECT_TRUE(b->Pmap(ScalarFn("inc", "add_scalar", 1), sb).ok());
}

// Issue 20 (quotas): one client could hold every device's memory. Each client's arrays (puts and
// run outputs, every shard and replica) count against --max-client-bytes; past it a put or run
// fails naming the quota and the flag, other clients keep their own, and a release makes room.
TEST_P(ClusterTest, EachClientsArraysStayWithinItsQuota) {
  client_quota_ = 32;
  Start(1, 1, 2);
  auto a = Connect("a"), b = Connect("b");
  Slice s = *a->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction f = *a->Pmap(ScalarFn("inc", "add_scalar", 1), s);
  const Sharding split = Sharding::Split({2}, 1, 0);
  Array x = *a->Put(F32({1, 2}), s.info().id, split);  // 8 bytes.
  std::vector<Array> kept;
  for (int i = 0; i < 3; ++i) kept.push_back((*f.Call({x}))[0]);  // 32 bytes now.
  ASSERT_TRUE(kept.back().Ready().status().ok());
  absl::Status over = CallStatus(f.Call({x}));
  ASSERT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_THAT(std::string(over.message()),
              ::testing::AllOf(::testing::HasSubstr("a run of program 'inc' needs 8 bytes"),
                               ::testing::HasSubstr("quota of 32"),
                               ::testing::HasSubstr("--max-client-bytes")));
  // A replicated put counts every replica: 16 bytes, refused too.
  auto put = a->Put(F32({1, 2}), s.info().id, Sharding::Replicated({2}, 1));
  EXPECT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted) << put.status();
  // Another client's quota is its own.
  Slice sb = *b->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  Array bx = *b->Put(F32({1, 2}), sb.info().id, Sharding::Replicated({2}, 1));
  EXPECT_TRUE(bx.Ready().status().ok());
  kept.pop_back();  // Released: room for one more run.
  auto again = f.Call({x});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Values((*again)[0]), (std::vector<float>{2, 3}));
}

// Issue 24: a tenant's clients share its memory quota, which the admin sets live (the cluster
// token over the wire: a client is refused), and the status shows each tenant and its share.
TEST_P(ClusterTest, ATenantsClientsShareItsQuotaAndTheStatusShowsTenants) {
  Start(1, 1, 2);
  ASSERT_TRUE(controller().SetTenant({.name = "team", .share = 3, .memory_bytes = 24}).ok());
  if (grpc()) {  // A client cannot set shares or quotas, its own tenant's included.
    absl::Status refused = api()->SetTenant({.name = "team", .share = 100});
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
    EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("cluster token"));
  }
  auto a = *Client::Connect(api(), "a", {"team", 50}), b = *Client::Connect(api(), "b", {"team"});
  auto c = *Client::Connect(api(), "c", {"other", 2});
  Slice s = *a->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  Slice sb = *b->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  const Sharding split = Sharding::Split({2}, 1, 0);
  Array x = *a->Put(F32({1, 2}), s.info().id, Sharding::Replicated({2}, 1));  // 16 bytes.
  ASSERT_TRUE(x.Ready().status().ok());
  auto over = b->Put(F32({1, 2, 3, 4}), sb.info().id, split);  // 16 more: past the 24.
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(std::string(over.status().message()),
              ::testing::AllOf(::testing::HasSubstr("tenant 'team'"),
                               ::testing::HasSubstr("already holds 16 of its quota of 24"),
                               ::testing::HasSubstr("pw tenant set team --memory")));
  Array y = *b->Put(F32({1, 2}), sb.info().id, split);  // 8: fits.
  ASSERT_TRUE(y.Ready().status().ok());
  Slice sc = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  Array z = *c->Put(F32({1, 2, 3, 4}), sc.info().id, split);  // Another tenant's quota: none.
  ASSERT_TRUE(z.Ready().status().ok());
  absl::StatusOr<ClusterStatus> st = api()->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->scheduling, "share");
  ASSERT_EQ(st->tenants.size(), 2u);
  EXPECT_EQ(st->tenants[0].name, "other");
  EXPECT_EQ(st->tenants[0].share, 2);
  EXPECT_EQ(st->tenants[1].name, "team");
  EXPECT_EQ(st->tenants[1].share, 3);  // The admin's, not client a's 50.
  EXPECT_TRUE(st->tenants[1].pinned);
  EXPECT_EQ(st->tenants[1].clients, 2);
  EXPECT_EQ(st->tenants[1].memory_quota_bytes, 24);
  EXPECT_EQ(st->tenants[1].memory_bytes, 24);
}

// Issue 24: the controller keeps nothing of clients that have gone: after thousands that each
// registered functions and a program (some of them ran it), its registries, plans, tenants and
// runs are empty again, and so are the workers' functions, executables, programs and plans.
TEST_P(ClusterTest, NothingOfThousandsOfClientsWithProgramsIsKept) {
  Start(1, 1, 2);
  const int cycles = grpc() ? 1000 : 10000;
  const ArraySpec v2{DType::kF32, Shape({2})};
  int64_t rss_early = 0;
  for (int i = 0; i < cycles; ++i) {
    if (i == cycles / 10) rss_early = ReadResidentMemory().now;
    auto c = Connect(absl::StrCat("client", i));
    Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
    BoundFunction f = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
    BoundFunction g = *c->Pmap(ReduceAddFn("reduce"), s);
    Program p = *c->Trace("p", {v2}, [&](std::vector<Value> v) { return std::vector{g(f(v[0]))}; });
    if (i % 100 == 0) {
      auto out = p.Call({F32({0, 0})});
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(Values((*out)[0]), (std::vector<float>{3, 3}));
    }
  }
  controller().WaitIdle();
  // A measurement to report, not a goal: the checks below are what must hold.
  std::printf("[ measured ] this process's RSS after %d clients: %.1f MiB, after %d: %.1f MiB\n",
              cycles / 10, rss_early / 1048576.0, cycles, ReadResidentMemory().now / 1048576.0);
  const Controller::Registry r = controller().registry();
  EXPECT_EQ(r.functions, 0u);
  EXPECT_EQ(r.programs, 0u);
  EXPECT_EQ(r.plans, 0u);
  EXPECT_EQ(r.signatures, 0u);
  EXPECT_EQ(r.runs, 0u);
  EXPECT_EQ(r.traces, 0u);
  EXPECT_EQ(r.clients, 0u);
  EXPECT_EQ(r.tenants, 0u);
  // The workers hear of each client's exit on their command streams: a bounded wait for them.
  const absl::Time deadline = absl::Now() + kDeadlockTimeout;
  ClusterStatus st;
  auto empty = [&] {
    st = StatusOfEveryHost(controller()).value();
    for (const HostStatus& h : st.hosts)
      if (h.functions + h.executables + h.plans + h.programs != 0) return false;
    return true;
  };
  while (!empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  for (const HostStatus& h : st.hosts) {
    EXPECT_EQ(h.functions, 0u) << h.host;
    EXPECT_EQ(h.executables, 0u) << h.host;
    EXPECT_EQ(h.plans, 0u) << h.host;
    EXPECT_EQ(h.programs, 0u) << h.host;
  }
  ExpectNothingLeft();
}

// Issue 21: arrays shared between clients. The importer reads and computes on the owner's array
// as on its own; the buffer lives while any client holds it (the owner's exit included); a
// writable share is re-pointed by a holder; revocation cuts the importers off; no client reaches
// another's array without the token.
TEST_P(ClusterTest, SharedArraysLiveWhileHeldAndRevocationCutsImportersOff) {
  Start(1, 1, 2);
  auto owner = Connect("owner"), reader = Connect("reader"), stranger = Connect("stranger");
  Slice s = *owner->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  const Sharding split = Sharding::Split({2}, 1, 0);
  Array w = *owner->Put(F32({1, 2}), s.info().id, split);
  const std::string token = *w.Share();
  EXPECT_THAT(token, ::testing::StartsWith("pws-"));
  EXPECT_EQ(token.size(), 36u);
  // Another client's array is not reachable by its id.
  EXPECT_EQ(controller().FetchArray(reader->id(), w.id()).Await().status().code(),
            absl::StatusCode::kNotFound);
  Array got = *reader->Import(token);
  EXPECT_EQ(got.id(), w.id());
  EXPECT_EQ(got.devices(), s.devices());
  EXPECT_EQ(Values(got), (std::vector<float>{1, 2}));
  // The reader computes on it on a slice of its own.
  Slice rs = *reader->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction inc = *reader->Pmap(ScalarFn("inc", "add_scalar", 1), rs);
  EXPECT_EQ(Values((*inc.Call({got}))[0]), (std::vector<float>{2, 3}));
  // Read-only: only the owner re-points it; the token is not the stranger's to revoke.
  Array mine = *reader->Put(F32({7, 8}), rs.info().id, split);
  auto repoint = mine.Share({.token = token});
  EXPECT_EQ(repoint.status().code(), absl::StatusCode::kPermissionDenied) << repoint.status();
  EXPECT_EQ(stranger->Revoke(token).code(), absl::StatusCode::kPermissionDenied);
  Array w2 = *owner->Put(F32({5, 6}), s.info().id, split);
  ASSERT_EQ(*w2.Share({.token = token}), token);
  EXPECT_EQ(Values(*stranger->Import(token)), (std::vector<float>{5, 6}));
  // Writable: a holder of the token points it at an array of its own.
  const std::string rw = *w.Share({.writable = true});
  ASSERT_TRUE(mine.Share({.token = rw}).ok());
  EXPECT_EQ(Values(*owner->Import(rw)), (std::vector<float>{7, 8}));
  // The owner's exit: what was imported lives on; its shares end.
  const BufferId kept = got.id();
  w = Array();
  w2 = Array();
  owner.reset();
  EXPECT_EQ(Values(got), (std::vector<float>{1, 2}));
  EXPECT_EQ(reader->Import(token).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(controller().FetchArray(reader->id(), kept).Await().ok());
  // Revocation: the stranger imported the reader's array through a share the reader revokes.
  const std::string r_token = *mine.Share();
  Array theirs = *stranger->Import(r_token);
  ASSERT_TRUE(reader->Revoke(r_token).ok());
  auto cut = theirs.ToHost();
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kNotFound) << cut.status();
  EXPECT_THAT(std::string(cut.status().message()), ::testing::HasSubstr("since revoked"));
  EXPECT_EQ(Values(mine), (std::vector<float>{7, 8})) << "the owner's own handle stays";
  EXPECT_EQ(stranger->Import(r_token).status().code(), absl::StatusCode::kNotFound);
  auto bad = stranger->Import(std::string(100, 'x'));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

// Issue 20: a disconnected client's functions stayed loaded on every worker (definitions and
// compiled executables) for as long as the worker ran; now they are unloaded on every host,
// and another client's stay.
TEST_P(ClusterTest, ADisconnectedClientsFunctionsAreUnloadedOnEveryHost) {
  Start(1, 2, 1);
  auto stays = Connect("stays");
  Slice ss = *stays->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction kept = *stays->Pmap(ScalarFn("kept", "add_scalar", 1), ss);
  auto per_host = [&](auto field) {
    std::vector<size_t> n;
    const ClusterStatus status = StatusOfEveryHost(controller()).value();
    for (const HostStatus& h : status.hosts) n.push_back(h.*field);
    return n;
  };
  {
    auto c = Connect("c");
    Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
    BoundFunction f = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
    BoundFunction g = *c->Pmap(ScalarFn("dbl", "mul_scalar", 2), s);
    Array x = *c->Put(F32({1, 2}), s.info().id, Sharding::Split({2}, 1, 0));
    EXPECT_EQ(Values((*g.Call({(*f.Call({x}))[0]}))[0]), (std::vector<float>{4, 6}));
    EXPECT_EQ(per_host(&HostStatus::functions), (std::vector<size_t>{3, 3}));
    EXPECT_EQ(per_host(&HostStatus::executables), (std::vector<size_t>{2, 2}));
    EXPECT_EQ(per_host(&HostStatus::plans), (std::vector<size_t>{2, 2}));
    // A worker process keeps the bodies of the host programs sent to it.
    const size_t bodies = grpc() ? 2 : 0;
    EXPECT_EQ(per_host(&HostStatus::programs), (std::vector<size_t>{bodies, bodies}));
  }
  // Over gRPC the unload is a command on each worker's stream, and plans go on the dispatch
  // thread: both a little later.
  const std::vector<size_t> none{0, 0};
  auto unloaded = [&] {
    return per_host(&HostStatus::functions) == std::vector<size_t>{1, 1} &&
           per_host(&HostStatus::plans) == none && per_host(&HostStatus::programs) == none;
  };
  const absl::Time deadline = absl::Now() + kDeadlockTimeout;
  while (!unloaded() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(per_host(&HostStatus::functions), (std::vector<size_t>{1, 1}));
  EXPECT_EQ(per_host(&HostStatus::executables), none);
  EXPECT_EQ(per_host(&HostStatus::plans), none);
  EXPECT_EQ(per_host(&HostStatus::programs), none);
  Array y = *stays->Put(F32({1, 2}), ss.info().id, Sharding::Split({2}, 1, 0));
  EXPECT_EQ(Values((*kept.Call({y}))[0]), (std::vector<float>{2, 3}));
}

TEST_P(ClusterTest, DisconnectReleasesEverything) {
  Start(1, 1, 2);
  {
    auto c = Connect("c");
    Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
    BoundFunction f = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
    Array x = *c->Put(F32({0, 0}), s.info().id, Sharding::Split({2}, 1, 0));
    std::vector<Array> kept;
    for (int i = 0; i < 10; ++i) kept.push_back((*f.Call({x}))[0]);
    ASSERT_TRUE(kept.back().Ready().status().ok());
    // The client goes away while still holding handles: the controller frees them.
    c.reset();
  }
  ExpectNothingLeft();
  for (const auto& d : controller().resource_manager().Devices()) EXPECT_EQ(d.load, 0);
}

TEST_P(ClusterTest, DisconnectCancelsRunsThatHaveNotLaunched) {
  Start(1, 1, 2, /*memory=*/16);  // Room for four f32 scalars per device.
  auto other = Connect("other");
  Slice os = *other->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  BoundFunction oinc = *other->Pmap(ScalarFn("inc", "add_scalar", 1), os);
  std::vector<Array> held, queued;
  std::vector<Future<>> ready;
  {
    auto c = Connect("c");
    Slice s = *c->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
    BoundFunction f = *c->Pmap(ScalarFn("inc", "add_scalar", 1), s);
    Array x = *c->Put(F32({0, 0}), s.info().id, Sharding::Split({2}, 1, 0));
    for (int i = 0; i < 3; ++i) held.push_back((*f.Call({x}))[0]);  // Device memory now full.
    for (auto& h : held) ASSERT_TRUE(h.Ready().status().ok());
    // These wait for memory on the devices: the first for room, the rest behind it.
    for (int i = 0; i < 20; ++i) queued.push_back((*f.Call({x}))[0]);
    EXPECT_FALSE(queued[0].Ready().AwaitFor(absl::Milliseconds(100)));
    // (Over gRPC these calls could reach the controller after the disconnect below.)
    if (!grpc())
      for (const Array& q : queued) ready.push_back(q.Ready());
    c.reset();  // Disconnects while its runs wait: they are cancelled, then its memory is freed.
  }
  controller().WaitIdle();
  // None of the waiting runs ran: each reports the cancellation.
  for (auto& r : ready) {
    ASSERT_TRUE(r.AwaitFor(kDeadlockTimeout));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "disconnected")) << r.status();
  }
  size_t cancelled = 0;
  const std::vector<HostStatus> hosts = StatusOfEveryHost(controller()).value().hosts;
  for (const auto& h : hosts) cancelled += h.cancelled_shards;
  EXPECT_EQ(cancelled, 40u);  // 20 runs, one shard per device.
  held.clear();
  queued.clear();
  ExpectNothingLeft();
  // Another client's work on the same devices is untouched.
  Array y = *other->Put(F32({1, 2}), os.info().id, Sharding::Split({2}, 1, 0));
  EXPECT_EQ(Values((*oinc.Call({y}))[0]), (std::vector<float>{2, 3}));
}


// ---- Traces (pw/trace): every stage of a 2-island program, on both transports.

// The span of `track` enclosing time `ts`, or nullptr.
const trace::Event* Enclosing(const std::vector<trace::Event>& spans, const trace::Event& at) {
  for (const trace::Event& e : spans)
    if (e.track == at.track && e.ts_ns <= at.ts_ns && at.ts_ns <= e.ts_ns + e.dur_ns) return &e;
  return nullptr;
}

int64_t IntArg(const trace::Event& e, const std::string& key) {
  for (const auto& [k, v] : e.args)
    if (k == key && std::holds_alternative<int64_t>(v)) return std::get<int64_t>(v);
  return -1;
}

std::string StrArg(const trace::Event& e, const std::string& key) {
  for (const auto& [k, v] : e.args)
    if (k == key && std::holds_alternative<std::string>(v)) return std::get<std::string>(v);
  return "";
}

TEST_P(ClusterTest, ATraceShowsEveryStageOfEveryRunLinkedByFlowsInGangOrder) {
  Start(2, 1, 2);
  // The admin traces (every tenant in full): over gRPC that takes the cluster token.
  std::unique_ptr<rpc::RemoteController> admin_remote;
  ControllerInterface* admin_api = api();
  if (grpc()) {
    admin_remote = *rpc::RemoteController::Dial(server_for_test()->address(),
                                                {.token = server_for_test()->cluster_token()});
    admin_api = admin_remote.get();
  }
  auto admin = *Client::Connect(admin_api, "admin");
  ASSERT_TRUE(admin->StartTrace().ok());
  EXPECT_EQ(admin->StartTrace().code(), absl::StatusCode::kFailedPrecondition);
  auto tenant = Connect("tenant-b");  // Traces too, without the token.
  ASSERT_TRUE(tenant->StartTrace().ok());
  constexpr int kRuns = 4;
  auto client_loop = [&](Client* c) {
    auto set = c->MakeVirtualDeviceSet();
    Slice s0 = *set.AddSlice({.num_devices = 2, .islands = {IslandId(0)}});
    Slice s1 = *set.AddSlice({.num_devices = 2, .islands = {IslandId(1)}});
    BoundFunction f0 = *c->Pmap(ReduceAddFn("first"), s0);
    BoundFunction f1 = *c->Pmap(ReduceAddFn("second"), s1);
    Program p = *c->Trace("two_islands", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
      return std::vector<Value>{f1(f0(v[0]))};
    });
    Array x = *c->Put(F32({0, 0}), s0.info().id, Sharding::Split({2}, 1, 0));
    for (int i = 0; i < kRuns; ++i) {
      auto out = p.Run({x});
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(Values((*out)[0]), (std::vector<float>{3, 3}));  // 0 -> 1 -> 2*1+1.
    }
  };
  std::thread ta(client_loop, admin.get()), tb(client_loop, tenant.get());
  ta.join();
  tb.join();
  // Without the cluster token, every tenant's spans in full are refused over the wire.
  if (grpc()) {
    auto refused = api()->StopTrace(tenant->id(), /*all_tenants=*/true).Await();
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  }
  absl::StatusOr<trace::Chunk> mine = tenant->StopTrace();
  ASSERT_TRUE(mine.ok()) << mine.status();
  absl::StatusOr<trace::Chunk> chunk = admin->StopTrace(/*all_tenants=*/true);
  ASSERT_TRUE(chunk.ok()) << chunk.status();

  // The tenant's own trace names its spans and hides the admin's.
  for (const trace::Event& e : mine->events) {
    if (e.phase != 'X' || e.client < 0) continue;
    if (e.client == tenant->id().value()) continue;
    EXPECT_THAT(e.name, ::testing::StartsWith("another tenant's ")) << e.name;
    EXPECT_TRUE(e.args.empty());
  }

  std::vector<trace::Event> spans;
  std::map<uint64_t, const trace::Event*> flow_out, flow_in;
  for (const trace::Event& e : chunk->events)
    if (e.phase == 'X') spans.push_back(e);
  for (const trace::Event& e : chunk->events) {
    if (e.phase == 's') flow_out[e.flow] = &e;
    if (e.phase == 'f') flow_in[e.flow] = &e;
  }
  // Every device computed each node of each run of both clients: one span per shard.
  std::map<int64_t, std::vector<const trace::Event*>> compute;  // By device.
  for (const trace::Event& e : spans)
    if (e.category == "compute") compute[e.track.id].push_back(&e);
  ASSERT_EQ(compute.size(), 4u);
  for (const auto& [device, on] : compute) {
    EXPECT_EQ(on.size(), 2u * kRuns) << "device " << device;
    for (const trace::Event* e : on) {
      EXPECT_EQ(e->name, device < 2 ? "first" : "second");
      EXPECT_EQ(e->track.host, device < 2 ? 0 : 1);
      EXPECT_EQ(StrArg(*e, "program"), "two_islands");
      EXPECT_GE(IntArg(*e, "run"), 0);
    }
  }
  // The transfers between the islands, with their bytes (a scalar shard each).
  int dcn = 0;
  for (const trace::Event& e : spans) {
    if (e.category != "transfer") continue;
    EXPECT_EQ(StrArg(e, "link"), "dcn");
    EXPECT_EQ(IntArg(e, "bytes"), 4);
    EXPECT_EQ(e.track, trace::TransfersTrack(HostId(1)));
    ++dcn;
  }
  EXPECT_EQ(dcn, 2 * 2 * kRuns);
  // Collectives inside the computations, on the devices' tracks.
  int collectives = 0;
  for (const trace::Event& e : spans) collectives += e.category == "collective";
  EXPECT_EQ(collectives, 4 * 2 * kRuns);
  // Flows: each device's first span of a run leads back, span by span, to its client's call:
  // compute <- host dispatch <- island scheduler <- controller submit <- client call.
  const std::vector<std::string> chain = {"compute", "dispatch", "schedule", "submit", "call"};
  int followed = 0;
  for (const auto& [id, first] : flow_in) {
    const trace::Event* in = first;
    const trace::Event* at = Enclosing(spans, *in);
    ASSERT_NE(at, nullptr) << "flow end outside any span";
    if (at->category != "compute") continue;
    for (size_t i = 1; i < chain.size(); ++i) {
      auto from = flow_out.find(in->flow);
      ASSERT_NE(from, flow_out.end()) << "a flow into a " << at->category << " span has no start";
      const trace::Event* up = Enclosing(spans, *from->second);
      ASSERT_NE(up, nullptr);
      EXPECT_EQ(up->category, chain[i]);
      EXPECT_EQ(up->client, at->client);
      if (i + 1 == chain.size()) break;
      // The flow that ends in `up`.
      const trace::Event* next = nullptr;
      for (const auto& [id2, in2] : flow_in)
        if (in2->track == up->track && in2->ts_ns >= up->ts_ns &&
            in2->ts_ns <= up->ts_ns + up->dur_ns)
          next = in2;
      ASSERT_NE(next, nullptr) << "no flow into the " << up->category << " span";
      in = next;
      at = up;
    }
    ++followed;
  }
  EXPECT_EQ(followed, 4 * 2 * kRuns);  // One per device per run.
  // Gang order: on every device of an island, runs compute in the order its scheduler chose.
  for (int island = 0; island < 2; ++island) {
    std::vector<std::pair<int64_t, int64_t>> decided;  // (position, run)
    for (const trace::Event& e : spans)
      if (e.category == "schedule" && e.track == trace::IslandTrack(IslandId(island)))
        decided.emplace_back(IntArg(e, "gang_position"), IntArg(e, "run"));
    std::sort(decided.begin(), decided.end());
    std::vector<int64_t> order;
    for (const auto& [pos, run] : decided) order.push_back(run);
    ASSERT_EQ(order.size(), 2u * kRuns);
    for (int64_t device : {2 * island, 2 * island + 1}) {
      std::vector<const trace::Event*> on = compute[device];
      std::sort(on.begin(), on.end(),
                [](const trace::Event* a, const trace::Event* b) { return a->ts_ns < b->ts_ns; });
      std::vector<int64_t> ran;
      for (const trace::Event* e : on) ran.push_back(IntArg(*e, "run"));
      EXPECT_EQ(ran, order) << "device " << device << " left its island's gang order";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(InProcess, ClusterTest, ::testing::Values(Transport::kInProcess));
// "GrpcCluster", "GrpcInProcess": make tsan leaves gRPC (uninstrumented) tests out by these
// prefixes.
INSTANTIATE_TEST_SUITE_P(GrpcCluster, ClusterTest, ::testing::Values(Transport::kGrpc));
INSTANTIATE_TEST_SUITE_P(GrpcInProcess, ClusterTest, ::testing::Values(Transport::kGrpcInProcess));

}  // namespace
}  // namespace pw
