// XLA compiled functions (StableHLO exported by the pinned JAX, run by the PJRT CPU plugin) in
// the runtime: bound to slices, traced into programs, mixed with native kernels.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/base/status_matchers.h"
#include "pw/client/client.h"
#include "pw/embedded/embedded_cluster.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

StableHloFunctionDef Load(const std::string& name, std::vector<ArraySpec> in,
                          std::vector<ArraySpec> out) {
  std::ifstream f(std::string(PW_STABLEHLO_TESTDATA) + "/" + name + ".mlirbc", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return {name, ss.str(), std::move(in), std::move(out)};
}

const ArraySpec kScalar{DType::kF32, Shape({})};

class XlaFunctionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = *EmbeddedCluster::Create(*ClusterSpec::Uniform(2, 1, 2));
    client_ = *Client::Connect(&cluster_->controller(), "xla");
  }
  void TearDown() override { client_.reset(); }
  Slice NewSlice() {
    return *client_->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  }
  std::unique_ptr<EmbeddedCluster> cluster_;
  std::unique_ptr<Client> client_;
};

// The paper's Figure 2 with its functions compiled by XLA.
TEST_F(XlaFunctionsTest, Figure2WithXlaFunctions) {
  Slice sa = NewSlice(), sb = NewSlice(), sc = NewSlice();
  auto a = client_->Pmap(Load("mul2", {kScalar}, {kScalar}), sa);
  auto b = client_->Pmap(Load("add1", {kScalar}, {kScalar}), sb);
  auto c = client_->Pmap(Load("div2", {kScalar}, {kScalar}), sc);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status() << b.status() << c.status();
  auto f = client_->Trace("f", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    Value x = (*a)(v[0]);
    return std::vector<Value>{(*b)(x), (*a)((*c)(x))};
  });
  ASSERT_TRUE(f.ok()) << f.status();
  auto out = f->Call({*HostArray::Of<float>(DType::kF32, Shape({2}), {1.f, 2.f})});
  ASSERT_TRUE(out.ok()) << out.status();
  auto y = (*out)[0].ToHost();
  auto z = (*out)[1].ToHost();
  ASSERT_TRUE(y.ok() && z.ok()) << y.status() << z.status();
  EXPECT_EQ(absl::StrCat("(", y->ToString(), ", ", z->ToString(), ")"),
            "(array([3., 5.]), array([2., 4.]))");
}

TEST_F(XlaFunctionsTest, XlaAndNativeFunctionsFeedEachOther) {
  Slice s = NewSlice();
  auto xla = client_->Pmap(Load("mul2", {kScalar}, {kScalar}), s);
  NativeFunctionBuilder nb("native_add1");
  int x = nb.Input(kScalar);
  auto native = client_->Pmap(nb.Build({nb.Op("add_scalar", {x}, {{"value", 1.0}})}), s);
  ASSERT_TRUE(xla.ok() && native.ok());
  auto f = client_->Trace("mixed", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    return std::vector<Value>{(*xla)((*native)((*xla)(v[0])))};
  });
  ASSERT_TRUE(f.ok()) << f.status();
  auto out = f->Call({*HostArray::Of<float>(DType::kF32, Shape({2}), {1.f, 2.f})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].ToHost()->values<float>(), (std::vector<float>{6.f, 10.f}));  // (2x+1)*2
}

TEST_F(XlaFunctionsTest, CompiledOnceAndSharedByTwoSlices) {
  FunctionInfo fn = *client_->Register(Load("add1", {kScalar}, {kScalar}));
  Slice s0 = NewSlice(), s1 = NewSlice();
  auto on0 = client_->Pmap(fn, s0);
  auto on1 = client_->Pmap(fn, s1);
  ASSERT_TRUE(on0.ok() && on1.ok());
  auto f = client_->Trace("twice", {{DType::kF32, Shape({2})}}, [&](std::vector<Value> v) {
    return std::vector<Value>{(*on1)((*on0)(v[0]))};
  });
  auto out = f->Call({*HostArray::Of<float>(DType::kF32, Shape({2}), {1.f, 2.f})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].ToHost()->values<float>(), (std::vector<float>{3.f, 4.f}));
}

TEST_F(XlaFunctionsTest, BadModulesFailTheRunNamingTheFunction) {
  Slice s = NewSlice();
  // Per-shard modules compile on the workers when registered: one XLA rejects fails there.
  auto broken = client_->Pmap(StableHloFunctionDef{"broken", "not stablehlo", {kScalar}, {kScalar}}, s);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("compiling function 'broken'"), std::string::npos)
      << broken.status();
  Array x = *client_->Put(*HostArray::Of<float>(DType::kF32, Shape({2}), {1.f, 2.f}),
                          s.info().id, Sharding::Split({2}, 1, 0));
  // A module whose real input shape differs from the declared one fails at run time too.
  auto lying = client_->Pmap(Load("times_two", {kScalar}, {kScalar}), s);  // Really f32[2].
  ASSERT_TRUE(lying.ok());
  auto r2 = lying->Call({x});
  ASSERT_TRUE(r2.ok());
  EXPECT_FALSE((*r2)[0].Ready().status().ok());
  // Empty modules are refused when registered.
  EXPECT_FALSE(client_->Register(StableHloFunctionDef{"empty", "", {kScalar}, {kScalar}}).ok());
  // And the runtime keeps serving.
  auto good = client_->Pmap(Load("add1", {kScalar}, {kScalar}), s);
  EXPECT_EQ((*good->Call({x}))[0].ToHost()->values<float>(), (std::vector<float>{2.f, 3.f}));
}

StableHloFunctionDef LoadSpmd(const std::string& name, int partitions) {
  const ArraySpec vec3{DType::kF32, Shape({3})};
  StableHloFunctionDef def = Load(name, {vec3}, {vec3});
  def.num_partitions = partitions;
  return def;
}

std::vector<float> Rows(int n) {  // Row i = (i, 10 i, 1).
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.insert(v.end(), {1.f * i, 10.f * i, 1.f});
  return v;
}

// An all-reduce inside one XLA function (jax.lax.psum under shard_map, 2 partitions): every
// device of the slice gets the sum of 2 x over the slice.
TEST_F(XlaFunctionsTest, SpmdFunctionAllReducesAcrossTheSlice) {
  Slice s = NewSlice();
  auto psum = client_->Pmap(LoadSpmd("psum2", 2), s);
  ASSERT_TRUE(psum.ok()) << psum.status();
  Array x = *client_->Put(*HostArray::Of<float>(DType::kF32, Shape({2, 3}), Rows(2)),
                          s.info().id, Sharding::Split({2}, 2, 0));
  for (int i = 0; i < 3; ++i) {  // Repeated runs reuse the compiled partitions.
    auto r = psum->Call({x});
    ASSERT_TRUE(r.ok()) << r.status();
    auto y = (*r)[0].ToHost();
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->values<float>(), (std::vector<float>{2, 20, 4, 2, 20, 4}));
  }
}

// The partitions of an SPMD module meet in XLA's collectives, in one host's PJRT client: on a
// slice of one host's four devices it runs; across two hosts of the embedded cluster it is
// refused at binding, as across two worker processes (each host has a PJRT client of its own).
TEST(XlaSpmdTest, SpmdFunctionRunsOnOneHostAndIsRefusedAcrossHosts) {
  {
    auto two_hosts = *EmbeddedCluster::Create(*ClusterSpec::Uniform(1, 2, 2));
    auto client = *Client::Connect(&two_hosts->controller(), "spmd");
    Slice s = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
    EXPECT_THAT(client->Pmap(LoadSpmd("psum4", 4), s).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("spans 2 hosts (worker processes, each with its own PJRT "
                                   "client)")));
  }
  auto cluster = *EmbeddedCluster::Create(*ClusterSpec::Uniform(1, 1, 4));
  auto client = *Client::Connect(&cluster->controller(), "spmd");
  Slice s = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
  auto gather = client->Pmap(LoadSpmd("allgather_sum4", 4), s);
  auto psum = client->Pmap(LoadSpmd("psum4", 4), s);
  ASSERT_TRUE(gather.ok() && psum.ok()) << gather.status() << psum.status();
  auto f = client->Trace("spmd", {{DType::kF32, Shape({4, 3})}}, [&](std::vector<Value> v) {
    return std::vector<Value>{(*psum)((*gather)(v[0]))};
  });
  ASSERT_TRUE(f.ok()) << f.status();
  auto out = f->Call({*HostArray::Of<float>(DType::kF32, Shape({4, 3}), Rows(4))});
  ASSERT_TRUE(out.ok()) << out.status();
  // gather: row i + sum of all 12 values (6 + 60 + 4 = 70); psum: 2 * sum over rows.
  // Column sums of rows + 70: (6 + 280, 60 + 280, 4 + 280); times 2.
  std::vector<float> row = {572, 680, 568};
  std::vector<float> want;
  for (int i = 0; i < 4; ++i) want.insert(want.end(), row.begin(), row.end());
  EXPECT_EQ((*out)[0].ToHost()->values<float>(), want);
}

// pw.pmap's export of the same functions: per-shard modules whose collectives run through the
// runtime's Collectives (pw/pjrt/runtime_collectives.h), not XLA's.
StableHloFunctionDef LoadRuntime(const std::string& name, int axis_size) {
  const ArraySpec vec3{DType::kF32, Shape({3})};
  StableHloFunctionDef def = Load(name, {vec3}, {vec3});
  def.collective_axis_size = axis_size;
  return def;
}

TEST(XlaRuntimeCollectivesTest, FunctionSpansHostsAndMatchesTheSpmdModule) {
  auto cluster = *EmbeddedCluster::Create(*ClusterSpec::Uniform(1, 2, 2));
  auto client = *Client::Connect(&cluster->controller(), "rt");
  Slice s = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
  auto gather = client->Pmap(LoadRuntime("rt_allgather_sum4", 4), s);
  auto psum = client->Pmap(LoadRuntime("rt_psum4", 4), s);
  ASSERT_TRUE(gather.ok() && psum.ok()) << gather.status() << psum.status();
  auto f = client->Trace("rt", {{DType::kF32, Shape({4, 3})}}, [&](std::vector<Value> v) {
    return std::vector<Value>{(*psum)((*gather)(v[0]))};
  });
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<float> row = {572, 680, 568};  // As in SpmdFunctionRunsOnOneHost...
  std::vector<float> want;
  for (int i = 0; i < 4; ++i) want.insert(want.end(), row.begin(), row.end());
  for (int i = 0; i < 3; ++i) {
    auto out = f->Call({*HostArray::Of<float>(DType::kF32, Shape({4, 3}), Rows(4))});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].ToHost()->values<float>(), want);
  }
  // Bound to a slice of another size: refused at bind time, naming both sizes.
  Slice two = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  auto wrong = client->Pmap(LoadRuntime("rt_psum4", 4), two);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("axis of 4 devices"), std::string::npos)
      << wrong.status();
}

// Overlapping slices ([0..3] and [0, 1] of one island) looping psum chains from two threads: the
// partitions meet in the runtime's collectives in the island's gang order, so nothing hangs.
// (With XLA's own collectives, psum4/psum2 SPMD modules, this hung and XLA ended the process.)
TEST(XlaRuntimeCollectivesTest, OverlappingSlicesFromTwoThreadsNeverDeadlock) {
  auto cluster = *EmbeddedCluster::Create(*ClusterSpec::Uniform(1, 1, 4));
  auto client = *Client::Connect(&cluster->controller(), "overlap");
  Slice big = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 4});
  Slice small = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  auto chain = [&](Slice& s, int n) {
    auto fn = client->Pmap(LoadRuntime(absl::StrCat("rt_psum", n), n), s);
    EXPECT_TRUE(fn.ok()) << fn.status();
    return *client->Trace(absl::StrCat("chain", n), {{DType::kF32, Shape({n, 3})}},
                          [&](std::vector<Value> v) {
                            Value x = v[0];
                            for (int k = 0; k < 8; ++k) x = (*fn)(x);
                            return std::vector<Value>{x};
                          });
  };
  Program p4 = chain(big, 4), p2 = chain(small, 2);
  auto loop = [](Program& p, int n, std::vector<std::string>& errors) {
    for (int i = 0; i < 100; ++i) {
      std::vector<float> ones(n * 3, 1.f);
      auto out = p.Call({*HostArray::Of<float>(DType::kF32, Shape({n, 3}), ones)});
      if (!out.ok()) return errors.push_back(out.status().ToString());
      auto y = (*out)[0].ToHost();
      if (!y.ok()) return errors.push_back(y.status().ToString());
      const float want = std::pow(2.f * n, 8);  // psum(2x) over n shards, 8 times.
      for (float v : y->values<float>())
        if (v != want) return errors.push_back(absl::StrCat("got ", v, ", want ", want));
    }
  };
  std::vector<std::string> e4, e2;
  std::thread a([&] { loop(p4, 4, e4); }), b([&] { loop(p2, 2, e2); });
  a.join();
  b.join();
  EXPECT_TRUE(e4.empty()) << e4.front();
  EXPECT_TRUE(e2.empty()) << e2.front();
}

// One partition's input fails (integer division by zero on that shard only) while its peer's is
// fine: the peer, already inside XLA's all-reduce, is not left waiting, neither output is handed
// on (the peer's would hold a sum without the failed shard), and the slice keeps serving.
TEST_F(XlaFunctionsTest, SpmdPartitionWithAFailedInputFailsTheWholeLaunch) {
  Slice s = NewSlice();
  const ArraySpec i32x3{DType::kS32, Shape({3})};
  StableHloFunctionDef def = Load("psum2_i32", {i32x3}, {i32x3});
  def.num_partitions = 2;
  auto psum = client_->Pmap(def, s);
  NativeFunctionBuilder nb("divide");
  int a = nb.Input(i32x3), b = nb.Input(i32x3);
  auto divide = client_->Pmap(nb.Build({nb.Op("div", {a, b})}), s);
  ASSERT_TRUE(psum.ok() && divide.ok()) << psum.status() << divide.status();
  auto f = client_->Trace("divide_then_psum", {{DType::kS32, Shape({2, 3})},
                                               {DType::kS32, Shape({2, 3})}},
                          [&](std::vector<Value> v) {
                            return std::vector<Value>{(*psum)((*divide)(v)[0])};
                          });
  ASSERT_TRUE(f.ok()) << f.status();
  const auto x = *HostArray::Of<int32_t>(DType::kS32, Shape({2, 3}), {2, 4, 6, 8, 10, 12});
  const auto bad = *HostArray::Of<int32_t>(DType::kS32, Shape({2, 3}), {2, 2, 2, 0, 2, 2});
  const auto good = *HostArray::Of<int32_t>(DType::kS32, Shape({2, 3}), {2, 2, 2, 2, 2, 2});
  for (int i = 0; i < 2; ++i) {
    auto out = f->Call({x, bad});
    ASSERT_TRUE(out.ok()) << out.status();
    absl::Status st = (*out)[0].Ready().status();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("integer division by zero"), std::string::npos) << st;
    auto y = f->Call({x, good});
    ASSERT_TRUE(y.ok()) << y.status();
    auto h = (*y)[0].ToHost();
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->template values<int32_t>(), (std::vector<int32_t>{5, 7, 9, 5, 7, 9}));
  }
}

// A device of an SPMD slice is removed while its partition is queued (behind an item the test
// holds) and the other partition may already wait inside XLA's all-reduce: the removed device's
// partition still runs (a stand-in on zeros, on its device's thread), so the other is not left
// waiting (XLA would end the process after 40 s), and the run fails, naming the removal.
TEST_F(XlaFunctionsTest, SpmdPartitionOfARemovedDeviceStillMeetsItsPeer) {
  Slice s = NewSlice();
  auto psum = client_->Pmap(LoadSpmd("psum2", 2), s);
  NativeFunctionBuilder nb("busy");  // Tens of milliseconds of tiny kernels.
  int v = nb.Input({DType::kF32, Shape({3})});
  for (int i = 0; i < 200000; ++i) v = nb.Op("add_scalar", {v}, {{"value", 0.0}});
  auto busy = client_->Pmap(nb.Build({v}), s);
  ASSERT_TRUE(psum.ok() && busy.ok()) << psum.status() << busy.status();
  auto f = client_->Trace("busy_then_psum", {{DType::kF32, Shape({2, 3})}},
                          [&](std::vector<Value> in) {
                            return std::vector<Value>{(*psum)((*busy)(in[0]))};
                          });
  ASSERT_TRUE(f.ok()) << f.status();
  const HostArray x = *HostArray::Of<float>(DType::kF32, Shape({2, 3}), Rows(2));
  auto warm = f->Call({x});  // Compiles both functions.
  ASSERT_TRUE(warm.ok() && (*warm)[0].Ready().status().ok());
  // Hold the second device, so its partitions are still queued when it is removed.
  const DeviceId held = s.info().devices[1];
  Device* device = nullptr;
  for (HostId h : {HostId(0), HostId(1)})
    if (device == nullptr) device = cluster_->worker(h)->FindDevice(held);
  ASSERT_NE(device, nullptr);
  Promise<> release;
  device->Enqueue([gate = release.future()](const absl::Status&) { gate.Await(); });
  auto out = f->Call({x});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(cluster_->RemoveDevice(held, "pulled for the test").Await().ok());
  release.Set();
  absl::Status st = (*out)[0].Ready().status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("pulled for the test"), std::string::npos) << st;
}

// Issue 19 item 4: an SPMD module compiles at its first dispatch, on the worker's compile thread:
// while XLA compiles it, the host's dispatch thread serves other programs (on its other devices).
// Seen failing before: the compile ran on the dispatch thread, and the native program waited
// behind it.
TEST(XlaCompileTest, AnSpmdCompileDoesNotHoldTheDispatchThread) {
  auto cluster = *EmbeddedCluster::Create(*ClusterSpec::Uniform(1, 1, 4));
  auto client = *Client::Connect(&cluster->controller(), "compile");
  Slice spmd = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  Slice other = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
  for (DeviceId d : other.info().devices)
    ASSERT_EQ(std::count(spmd.info().devices.begin(), spmd.info().devices.end(), d), 0);
  Promise<> compiling, release;
  std::atomic<bool> entered{false};
  cluster->worker(HostId(0))->pjrt_backend()->SetCompileHookForTesting(
      [&, gate = release.future()](const std::string& name) {
        if (name != "psum2" || entered.exchange(true)) return;
        compiling.Set();
        gate.Await();
      });
  auto psum = client->Pmap(LoadSpmd("psum2", 2), spmd);
  NativeFunctionBuilder nb("add_one");
  const int in = nb.Input({DType::kF32, Shape({3})});
  auto add_one = client->Pmap(nb.Build({nb.Op("add_scalar", {in}, {{"value", 1.0}})}), other);
  ASSERT_TRUE(psum.ok() && add_one.ok()) << psum.status() << add_one.status();
  const HostArray x = *HostArray::Of<float>(DType::kF32, Shape({2, 3}), Rows(2));
  Array on_spmd = *client->Put(x, spmd.info().id, Sharding::Split({2}, 2, 0));
  Array on_other = *client->Put(x, other.info().id, Sharding::Split({2}, 2, 0));
  std::thread first([&] {
    auto r = psum->Call({on_spmd});
    ASSERT_TRUE(r.ok()) << r.status();
    auto y = (*r)[0].ToHost();
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->values<float>(), (std::vector<float>{2, 20, 4, 2, 20, 4}));
  });
  compiling.future().Await();
  // A bounded wait for what must happen (the native program completes), not for what must not.
  std::atomic<bool> served{false};
  Promise<> native_done;
  Future<> native_finished = native_done.future();
  std::thread second([&, done = std::move(native_done)]() mutable {
    auto r = add_one->Call({on_other});
    if (r.ok() && (*r)[0].ToHost().ok()) served = true;
    done.Set();
  });
  const bool finished = native_finished.AwaitFor(absl::Seconds(60));
  release.Set();
  first.join();
  second.join();
  EXPECT_TRUE(finished && served) << "the native program waited behind the XLA compile";
}

// Issue 20: workers kept every function ever registered, and the PJRT cache every executable, for
// as long as they ran. A disconnected client's functions are unloaded on every host and their
// executables freed; the same module registered again compiles again and runs.
TEST(XlaCompileTest, ADisconnectedClientsExecutablesAreFreed) {
  auto cluster = *EmbeddedCluster::Create(*ClusterSpec::Uniform(1, 1, 2));
  pjrt::PjrtBackend* backend = cluster->worker(HostId(0))->pjrt_backend().get();
  const HostArray x = *HostArray::Of<float>(DType::kF32, Shape({2}), {1.f, 2.f});
  for (int round = 0; round < 2; ++round) {
    auto client = *Client::Connect(&cluster->controller(), "unload");
    Slice s = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 2});
    auto add1 = client->Pmap(Load("add1", {kScalar}, {kScalar}), s);
    auto spmd = client->Pmap(LoadSpmd("psum2", 2), s);
    ASSERT_TRUE(add1.ok() && spmd.ok()) << add1.status() << spmd.status();
    auto out = add1->Call({*client->Put(x, s.info().id, Sharding::Split({2}, 1, 0))});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].ToHost()->values<float>(), (std::vector<float>{2.f, 3.f}));
    auto rows = spmd->Call({*client->Put(*HostArray::Of<float>(DType::kF32, Shape({2, 3}), Rows(2)),
                                         s.info().id, Sharding::Split({2}, 2, 0))});
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_TRUE((*rows)[0].ToHost().ok());
    HostStatus h = *cluster->worker(HostId(0))->Status().Await();
    EXPECT_EQ(h.functions, 2u);
    EXPECT_EQ(h.executables, 2u);
    EXPECT_EQ(backend->num_cached(), 2u);
    EXPECT_EQ(backend->num_compiles(), 2 * (round + 1));  // Compiled again after the unload.
    out->clear();
    rows->clear();
    client.reset();  // Disconnects.
    // Plans (which hold executables) are dropped on the dispatch thread, a little later, and the
    // last holder of an executable can let go on another of the worker's threads after that.
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (((h = *cluster->worker(HostId(0))->Status().Await()).plans != 0 ||
            backend->num_cached() != 0) &&
           absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(2));
    EXPECT_EQ(h.plans, 0u);
    EXPECT_EQ(h.functions, 0u);
    EXPECT_EQ(h.executables, 0u);
    EXPECT_EQ(backend->num_cached(), 0u) << "round " << round;
  }
}

TEST_F(XlaFunctionsTest, SpmdFunctionBindsOnlyToSlicesOfItsPartitionCount) {
  Slice s = NewSlice();  // 2 devices.
  auto wrong = client_->Pmap(LoadSpmd("psum4", 4), s);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("SPMD module of 4 partitions"), std::string::npos)
      << wrong.status();
  StableHloFunctionDef zero = LoadSpmd("psum2", 0);
  EXPECT_FALSE(client_->Pmap(zero, s).ok());
}

}  // namespace
}  // namespace pw
