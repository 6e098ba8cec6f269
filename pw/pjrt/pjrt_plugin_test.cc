#include "pw/pjrt/pjrt_plugin.h"
#include "pw/pjrt/pjrt_backend.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/base/status_matchers.h"
#include "pw/executor/collectives.h"
#include "pw/pjrt/runtime_collectives.h"
#include "pw/pjrt/shard_executable.h"

namespace pw::pjrt {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class PjrtTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto plugin = PjrtPlugin::Load(PW_PJRT_CPU_PLUGIN);
    ASSERT_TRUE(plugin.ok()) << plugin.status();
    auto client = PjrtClient::Create(*plugin);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = client->release();
  }
  static void TearDownTestSuite() { delete client_; }
  static PjrtClient* client_;
};
PjrtClient* PjrtTest::client_ = nullptr;

TEST(PjrtPluginTest, MissingFileIsNotFoundNamingThePath) {
  auto p = PjrtPlugin::Load("/nonexistent/libpjrt_nothing.so");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find("/nonexistent/libpjrt_nothing.so"), std::string::npos);
}

TEST(PjrtPluginTest, LibraryWithoutGetPjrtApiIsRejected) {
  auto p = PjrtPlugin::Load("libm.so.6");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("GetPjrtApi"), std::string::npos) << p.status();
}

TEST_F(PjrtTest, PluginReportsCompatibleVersionAndCpuDevices) {
  EXPECT_EQ(client_->plugin()->major_version(), PJRT_API_MAJOR);
  EXPECT_GE(client_->plugin()->minor_version(), PJRT_API_MINOR);
  EXPECT_EQ(client_->platform_name(), "cpu");
  EXPECT_GE(client_->num_devices(), 1);
}

// What the pinned JAX exports compiles and runs on the pinned plugin.
TEST_F(PjrtTest, CpuClientWithOneDevicePerSliceShard) {
  auto plugin = PjrtPlugin::Load(PW_PJRT_CPU_PLUGIN);
  ASSERT_TRUE(plugin.ok());
  auto four = PjrtClient::Create(*plugin, /*cpu_device_count=*/4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ((*four)->num_devices(), 4);
  auto b = (*four)->BufferFromHost(*HostArray::Of<float>(DType::kF32, Shape({1}), {7.f}), 3);
  ASSERT_TRUE(b.ok()) << b.status();
  float back = 0;
  ASSERT_TRUE((*b)->CopyToHost(&back).status().ok());
  EXPECT_EQ(back, 7.f);
  EXPECT_FALSE(PjrtClient::Create(*plugin, -1).ok());
}

// A client made for a slice's devices runs each computation on the launching thread (the device
// executor is the device's stream), once its inputs are ready: a chain of launches from a fresh
// buffer has computed at each return. (An asynchronous client would queue the chain on its own
// threads, waking one per computation.)
TEST(PjrtClientTest, CpuClientForDevicesComputesOnTheLaunchingThread) {
  auto plugin = PjrtPlugin::Load(PW_PJRT_CPU_PLUGIN);
  ASSERT_TRUE(plugin.ok());
  auto two = PjrtClient::Create(*plugin, /*cpu_device_count=*/2);
  ASSERT_TRUE(two.ok()) << two.status();
  const ArraySpec spec{DType::kF32, Shape({128, 128})};
  auto exe = (*two)->Compile(
      "tanh_matmul", ReadFile(std::string(PW_STABLEHLO_TESTDATA) + "/tanh_matmul.mlirbc"), {spec});
  ASSERT_TRUE(exe.ok()) << exe.status();
  for (int round = 0; round < 3; ++round) {
    HostArray zeros{spec, Bytes(spec.size_bytes(), 0)};
    auto x = (*two)->BufferFromHost(zeros, 1);
    ASSERT_TRUE(x.ok()) << x.status();
    std::shared_ptr<PjrtBuffer> y = *x;
    for (int i = 0; i < 4; ++i) {
      auto launched = (*exe)->Launch({y}, 1, DeviceId(1));
      ASSERT_TRUE(launched.ok()) << launched.status();
      EXPECT_TRUE(launched->computed.IsReady()) << "round " << round << ", launch " << i;
      y = launched->outputs[0];
    }
    std::vector<float> out(128 * 128, 1.f);
    Future<> copied = y->CopyToHost(out.data());
    // Computed, on CPU, dense: read in place on this thread, not on the plugin's thread pool.
    EXPECT_TRUE(copied.IsReady()) << "round " << round;
    ASSERT_TRUE(copied.Await().ok());
    EXPECT_EQ(out, std::vector<float>(128 * 128, 0.f));
  }
}

TEST_F(PjrtTest, JaxExportCompilesAndRuns) {
  ArraySpec f32_2{DType::kF32, Shape({2})};
  auto exe = client_->Compile("times_two",
                              ReadFile(std::string(PW_STABLEHLO_TESTDATA) + "/times_two.mlirbc"),
                              {f32_2});
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->num_outputs(), 1u);
  auto x = client_->BufferFromHost(*HostArray::Of<float>(DType::kF32, Shape({2}), {1.f, 2.f}), 0);
  ASSERT_TRUE(x.ok()) << x.status();
  auto out = (*exe)->Execute({*x}).Await();
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0]->spec(), f32_2);
  std::vector<float> y(2);
  ASSERT_TRUE((*out)[0]->CopyToHost(y.data()).status().ok());
  EXPECT_EQ(y, (std::vector<float>{2.f, 4.f}));
}

TEST_F(PjrtTest, MatmulTanhMatchesHostMath) {
  auto exe = client_->Compile(
      "affine", ReadFile(std::string(PW_STABLEHLO_TESTDATA) + "/affine.mlirbc"),
      {{DType::kF32, Shape({4, 3})}, {DType::kF32, Shape({3, 2})}, {DType::kF32, Shape({2})}});
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::vector<float> x = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1};
  std::vector<float> w = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  std::vector<float> b = {0.01f, -0.01f};
  auto bx = *client_->BufferFromHost(*HostArray::Of<float>(DType::kF32, Shape({4, 3}), x), 0);
  auto bw = *client_->BufferFromHost(*HostArray::Of<float>(DType::kF32, Shape({3, 2}), w), 0);
  auto bb = *client_->BufferFromHost(*HostArray::Of<float>(DType::kF32, Shape({2}), b), 0);
  auto out = (*exe)->Execute({bx, bw, bb}).Await();
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<float> y(8);
  ASSERT_TRUE((*out)[0]->CopyToHost(y.data()).status().ok());
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) {
      float acc = b[j];
      for (int k = 0; k < 3; ++k) acc += x[i * 3 + k] * w[k * 2 + j];
      EXPECT_NEAR(y[i * 2 + j], std::tanh(acc), 1e-5) << i << "," << j;
    }
}

TEST_F(PjrtTest, MalformedStableHloIsAnErrorNamingTheFunction) {
  auto exe = client_->Compile("broken", "this is not StableHLO", {});
  ASSERT_FALSE(exe.ok());
  EXPECT_NE(exe.status().message().find("compiling function 'broken'"), std::string::npos)
      << exe.status();
  EXPECT_FALSE(client_->Compile("empty", "", {}).ok());
}

TEST_F(PjrtTest, ShapeMismatchAtCallTimeIsAnError) {
  auto exe = *client_->Compile(
      "times_two", ReadFile(std::string(PW_STABLEHLO_TESTDATA) + "/times_two.mlirbc"),
      {{DType::kF32, Shape({2})}});
  auto x3 = *client_->BufferFromHost(*HostArray::Of<float>(DType::kF32, Shape({3}), {1, 2, 3}), 0);
  auto r = exe->Execute({x3}).Await();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("function 'times_two' input 0 expects f32[2], got f32[3]"),
            std::string::npos) << r.status();
  EXPECT_FALSE(exe->Execute({}).Await().ok());
  EXPECT_FALSE(client_->BufferFromHost(*HostArray::Of<float>(DType::kF32, Shape({1}), {1}), 99).ok());
}

// An SPMD module (jax.shard_map with a psum, 4 partitions) placed on the client's devices in a
// permuted order; each partition is launched on its own thread, as the runtime's device executors
// do, and they meet in the all-reduce.
TEST_F(PjrtTest, SpmdPartitionsLaunchedSeparatelyMeetInTheirCollective) {
  auto plugin = PjrtPlugin::Load(PW_PJRT_CPU_PLUGIN);
  ASSERT_TRUE(plugin.ok());
  std::shared_ptr<PjrtClient> four = *PjrtClient::Create(*plugin, 4);
  const std::vector<int> placement = {2, 0, 3, 1};  // Partition p runs on client device placement[p].
  const ArraySpec block{DType::kF32, Shape({1, 3})};
  auto exe = four->Compile("psum4", ReadFile(std::string(PW_STABLEHLO_TESTDATA) + "/psum4.mlirbc"),
                           {block}, placement);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->num_partitions(), 4);
  for (int launch = 1; launch <= 3; ++launch) {  // Repeated launches reuse the executable.
    std::vector<Future<std::vector<std::shared_ptr<PjrtBuffer>>>> outs(4);
    std::vector<std::thread> threads;
    for (int p = 0; p < 4; ++p) {
      threads.emplace_back([&, p] {
        const ArraySpec view{DType::kF32, Shape({3})};
        auto x = four->BufferFromHost(
            *HostArray::Of<float>(DType::kF32, Shape({3}), {1.f * p, 10.f * p, launch * 1.f}),
            placement[p], DeviceId(p), &block.shape);
        ASSERT_TRUE(x.ok()) << x.status();
        EXPECT_EQ((*x)->spec().shape, Shape({3}));
        outs[p] = (*exe)->Execute({*x}, placement[p], DeviceId(p), launch, {view});
      });
    }
    for (auto& t : threads) t.join();
    for (int p = 0; p < 4; ++p) {
      auto r = outs[p].Await();
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ((*r)[0]->spec().shape, Shape({3}));
      EXPECT_EQ((*r)[0]->pjrt_spec().shape, Shape({1, 3}));
      std::vector<float> y(3);
      ASSERT_TRUE((*r)[0]->CopyToHost(y.data()).status().ok());
      // sum over partitions of 2 * x_p = 2 * (0+1+2+3) * (1, 10) and 2 * 4 * launch.
      EXPECT_EQ(y, (std::vector<float>{12.f, 120.f, 8.f * launch})) << "partition " << p;
    }
  }
  EXPECT_FALSE(four->Compile("psum4", "x", {block}, std::vector<int>{0, 9}).ok());
}

// The backend's compile cache: one compile per (function, specs, placement), shared by callers.
TEST(PjrtBackendTest, CompilesOncePerFingerprint) {
  auto backend = std::make_shared<PjrtBackend>(
      PW_PJRT_CPU_PLUGIN, std::vector<DeviceId>{DeviceId(7), DeviceId(3), DeviceId(5), DeviceId(1)});
  ASSERT_TRUE(backend->Client().ok());
  EXPECT_EQ(backend->IndexOf(DeviceId(5)), 2);
  EXPECT_EQ(backend->IndexOf(DeviceId(2)), -1);
  const std::string module = ReadFile(std::string(PW_STABLEHLO_TESTDATA) + "/psum2.mlirbc");
  const ArraySpec block{DType::kF32, Shape({1, 3})};
  auto a = backend->Compile("psum2", module, {block}, {0, 1});
  auto b = backend->Compile("psum2", module, {block}, {0, 1});
  ASSERT_TRUE(a.ok() && b.ok()) << a.status();
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(backend->num_compiles(), 1);
  auto c = backend->Compile("psum2", module, {block}, {2, 3});  // Another slice: its own compile.
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(a->get(), c->get());
  EXPECT_EQ(backend->num_compiles(), 2);
  EXPECT_FALSE(backend->Compile("bad", "not stablehlo", {block}, {}).ok());
  EXPECT_FALSE(backend->Compile("bad", "not stablehlo", {block}, {}).ok());  // Errors not cached.
  EXPECT_EQ(backend->num_compiles(), 4);
}

// Callers asking for one fingerprint at once share one compile (the others wait for it, not for
// a lock), and each gets the same executable.
TEST(PjrtBackendTest, ConcurrentRequestsForOneFunctionCompileItOnce) {
  auto backend = std::make_shared<PjrtBackend>(PW_PJRT_CPU_PLUGIN,
                                               std::vector<DeviceId>{DeviceId(0), DeviceId(1)});
  ASSERT_TRUE(backend->Client().ok());
  const std::string module = ReadFile(std::string(PW_STABLEHLO_TESTDATA) + "/tanh_matmul.mlirbc");
  const ArraySpec spec{DType::kF32, Shape({128, 128})};
  std::vector<const PjrtExecutable*> got(4, nullptr);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto exe = backend->Compile("tanh_matmul", module, {spec}, {});
      if (exe.ok()) got[i] = exe->get();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(backend->num_compiles(), 1);
  for (const PjrtExecutable* e : got) EXPECT_EQ(e, got[0]);
  EXPECT_NE(got[0], nullptr);
}

// A pw.pmap export (rt_psum4: one per-shard module whose psum is a pw_all_reduce custom call):
// each shard launched on its own thread meets the others through the runtime's Collectives,
// found by the FFI handler in the launch's execute context.
class PjrtRuntimeCollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = std::make_shared<PjrtBackend>(PW_PJRT_CPU_PLUGIN, devices_);
    ASSERT_TRUE(backend_->RuntimeCollectives().ok()) << backend_->RuntimeCollectives();
    Load("rt_psum4");
  }

  // Compiles test function `name` (f32[3] -> f32[3], collectives over 4 devices) as exe_.
  void Load(const std::string& name) {
    StableHloFunctionDef def{name, ReadFile(absl::StrCat(PW_STABLEHLO_TESTDATA, "/", name,
                                                         ".mlirbc")),
                             {{DType::kF32, Shape({3})}}, {{DType::kF32, Shape({3})}}, 1, 4};
    auto exe = PjrtShardExecutable::Compile(backend_, def, devices_);
    ASSERT_TRUE(exe.ok()) << exe.status();
    exe_ = *exe;
  }

  // Runs rank r of run `run` on its own thread each; their outputs or errors.
  std::vector<absl::StatusOr<std::vector<float>>> LaunchAll(int run) {
    std::vector<absl::StatusOr<std::vector<float>>> outs(4, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) threads.emplace_back([&, r] { outs[r] = LaunchRank(run, r); });
    for (auto& t : threads) t.join();
    return outs;
  }

  // Launches rank r of run `run` with input (r, 10 r, run); returns its output or error.
  absl::StatusOr<std::vector<float>> LaunchRank(int run, int r) {
    auto x = HostDeviceBuffer::Create({DType::kF32, Shape({3})}, devices_[r]);
    const float in[3] = {1.f * r, 10.f * r, 1.f * run};
    std::memcpy(x->mutable_data(), in, sizeof(in));
    ShardLaunch launch;
    launch.key = {run, 0, 0};
    launch.rank = r;
    launch.slice_devices = devices_;
    launch.device = devices_[r];
    launch.inputs.push_back(x);
    launch.collectives = &collectives_;
    auto out = exe_->ExecuteShard(launch).Await();
    if (!out.ok()) return out.status();
    std::vector<float> y(3);
    PW_RETURN_IF_ERROR((*out)[0]->CopyToHost(y.data()).status());
    return y;
  }

  const std::vector<DeviceId> devices_ = {DeviceId(4), DeviceId(5), DeviceId(6), DeviceId(7)};
  std::shared_ptr<PjrtBackend> backend_;
  ExecutableRef exe_;
  Collectives collectives_;
};

TEST_F(PjrtRuntimeCollectivesTest, ShardsOnTheirOwnThreadsMeetInTheRuntimesAllReduce) {
  for (int run = 1; run <= 3; ++run) {
    std::vector<absl::StatusOr<std::vector<float>>> outs = LaunchAll(run);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(outs[r].ok()) << outs[r].status();
      EXPECT_EQ(*outs[r], (std::vector<float>{12.f, 120.f, 8.f * run})) << "rank " << r;
    }
  }
  EXPECT_EQ(collectives_.pending(), 0u);
}

// psum over "model" of a (data 2, model 2) mesh: ranks {0, 1} and {2, 3} reduce apart.
TEST_F(PjrtRuntimeCollectivesTest, ACollectiveOverOneAxisOfAMeshMeetsInEachGroupApart) {
  Load("rt_psum_model4");
  for (int run = 1; run <= 2; ++run) {
    std::vector<absl::StatusOr<std::vector<float>>> outs = LaunchAll(run);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(outs[r].ok()) << outs[r].status();
      const float sum = r < 2 ? 0.f + 1.f : 2.f + 3.f;  // 2 x (r of both ranks of its group).
      EXPECT_EQ(*outs[r], (std::vector<float>{2.f * sum, 20.f * sum, 4.f * run})) << "rank " << r;
    }
  }
  EXPECT_EQ(collectives_.pending(), 0u);
}

TEST(CollectiveLaunchTest, GroupOfFindsTheShardsGroupAndRefusesGroupsThatDoNotSplitTheLaunch) {
  const std::vector<DeviceId> devices = {DeviceId(4), DeviceId(5), DeviceId(6), DeviceId(7)};
  Collectives collectives;
  CollectiveLaunch launch(CollectiveKey{1, 0, 0}, 2, devices, &collectives);
  const int64_t by_data[] = {0, 2, 1, 3};  // Over "data" of a 2 x 2 mesh.
  absl::StatusOr<CollectiveLaunch::Group> g = launch.GroupOf(by_data, 2);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->index, 0);
  EXPECT_EQ(g->rank, 1);
  EXPECT_EQ(g->devices, (std::vector<DeviceId>{DeviceId(4), DeviceId(6)}));
  EXPECT_EQ(launch.NextKey(0, g->index).group, 0);
  EXPECT_EQ(launch.NextKey(0, 1).group, 1);

  const int64_t twice[] = {0, 1, 1, 3};
  const int64_t outside[] = {0, 1, 2, 4};
  const int64_t short_list[] = {0, 1};
  EXPECT_THAT(launch.GroupOf(twice, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 1 at position 2 is twice")));
  EXPECT_THAT(launch.GroupOf(outside, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4 at position 3 is outside")));
  EXPECT_THAT(launch.GroupOf(short_list, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("do not split the launch's 4")));
  EXPECT_THAT(launch.GroupOf(by_data, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("groups of 3")));
}

TEST_F(PjrtRuntimeCollectivesTest, ARemovedPeerFailsTheCollectiveNamingItInsteadOfHanging) {
  std::vector<absl::StatusOr<std::vector<float>>> outs(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) threads.emplace_back([&, r] { outs[r] = LaunchRank(1, r); });
  // Rank 3's device goes away before it launches: the three waiting shards fail, naming it.
  collectives_.AbortDevice(devices_[3], absl::UnavailableError("device:7 was removed"));
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(outs[r].ok()) << "rank " << r;
    EXPECT_THAT(std::string(outs[r].status().message()),
                ::testing::AllOf(::testing::HasSubstr("device:7 was removed"),
                                 ::testing::HasSubstr("all_reduce")));
  }
  // The process goes on serving: a launch without the removed device still runs.
  EXPECT_FALSE(LaunchRank(2, 0).ok());  // Its slice still includes the removed device.
}

TEST_F(PjrtRuntimeCollectivesTest, ALaunchWithoutTheRuntimesCollectivesIsAnErrorNotACrash) {
  auto x = HostDeviceBuffer::Create({DType::kF32, Shape({3})}, devices_[0]);
  std::memset(x->mutable_data(), 0, 12);
  ShardLaunch launch;
  launch.key = {1, 0, 0};
  launch.slice_devices = devices_;
  launch.device = devices_[0];
  launch.inputs.push_back(x);
  auto out = exe_->ExecuteShard(launch).Await();  // No Collectives*.
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              ::testing::HasSubstr("without the runtime's collectives"));
}

TEST(PjrtRuntimeCollectivesBindTest, AFunctionForAnotherAxisSizeIsRefused) {
  const std::vector<DeviceId> two = {DeviceId(0), DeviceId(1)};
  auto backend = std::make_shared<PjrtBackend>(PW_PJRT_CPU_PLUGIN, two);
  StableHloFunctionDef def{"rt_psum4", ReadFile(std::string(PW_STABLEHLO_TESTDATA) +
                                                "/rt_psum4.mlirbc"),
                           {{DType::kF32, Shape({3})}}, {{DType::kF32, Shape({3})}}, 1, 4};
  auto exe = PjrtShardExecutable::Compile(backend, def, two);
  ASSERT_FALSE(exe.ok());
  EXPECT_THAT(std::string(exe.status().message()),
              ::testing::HasSubstr("collectives over an axis of 4 devices"));
}

}  // namespace
}  // namespace pw::pjrt
