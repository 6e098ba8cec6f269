#include "pw/executor/native_function.h"

#include <cstring>
#include <limits>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

std::shared_ptr<HostDeviceBuffer> F32(std::vector<float> v, Shape s, DeviceId d = DeviceId(0)) {
  return HostDeviceBuffer::FromHost({DType::kF32, s}, d, v.data());
}
std::vector<float> Read(const DeviceBufferRef& b) {
  std::vector<float> v(b->spec().num_elements());
  b->CopyToHost(v.data()).status().IgnoreError();
  return v;
}

const DeviceId kDevice0[] = {DeviceId(0)};
const DeviceId kDevices01[] = {DeviceId(0), DeviceId(1)};

ShardLaunch Single(std::vector<DeviceBufferRef> inputs) {
  ShardLaunch l;
  l.slice_devices = kDevice0;
  l.device = DeviceId(0);
  l.inputs.assign(inputs.begin(), inputs.end());
  return l;
}

TEST(NativeFunctionTest, ElementwiseChain) {
  NativeFunctionBuilder b("f");
  int x = b.Input({DType::kF32, Shape({3})});
  int y = b.Op("mul_scalar", {x}, {{"value", 2.0}});
  int z = b.Op("add", {y, x});
  auto exe = CompileNative(b.Build({z, y}), 1);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->output_specs()[0].ToString(), "f32[3]");
  auto out = (*exe)->ExecuteShard(Single({F32({1, 2, 3}, Shape({3}))})).Await();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Read((*out)[0]), (std::vector<float>{3, 6, 9}));
  EXPECT_EQ(Read((*out)[1]), (std::vector<float>{2, 4, 6}));
}

// Issue 24: hold_device keeps its device at least `micros` (a lower bound: a sleep never ends
// early), then passes its operand on; out of range it is an error naming the range.
TEST(NativeFunctionTest, HoldDeviceHoldsTheDeviceThenCopies) {
  NativeFunctionBuilder b("hold");
  int x = b.Input({DType::kF32, Shape({2})});
  auto exe = CompileNative(b.Build({b.Op("hold_device", {x}, {{"micros", 3000}})}), 1);
  ASSERT_TRUE(exe.ok()) << exe.status();
  const absl::Time start = absl::Now();
  auto out = (*exe)->ExecuteShard(Single({F32({1, 2}, Shape({2}))})).Await();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(3));
  EXPECT_EQ(Read((*out)[0]), (std::vector<float>{1, 2}));
  NativeFunctionBuilder b2("hold_long");
  int x2 = b2.Input({DType::kF32, Shape({2})});
  auto forever = *CompileNative(b2.Build({b2.Op("hold_device", {x2}, {{"micros", 1e9}})}), 1);
  absl::Status s = forever->ExecuteShard(Single({F32({1, 2}, Shape({2}))})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside 0 ... 1e+07"), std::string::npos) << s;
}

TEST(NativeFunctionTest, MatmulUsesBlas) {
  NativeFunctionBuilder b("mm");
  int a = b.Input({DType::kF32, Shape({2, 3})});
  int w = b.Input({DType::kF32, Shape({3, 2})});
  auto exe = CompileNative(b.Build({b.Op("matmul", {a, w})}), 1);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto out = (*exe)->ExecuteShard(Single({F32({1, 2, 3, 4, 5, 6}, Shape({2, 3})),
                                          F32({1, 0, 0, 1, 1, 1}, Shape({3, 2}))}))
                 .Await();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(Read((*out)[0]), (std::vector<float>{4, 5, 10, 11}));
}

TEST(NativeFunctionTest, CompileErrorsNameFunctionOpAndKernel) {
  {
    NativeFunctionBuilder b("bad");
    int x = b.Input({DType::kF32, Shape({2})});
    auto e = CompileNative(b.Build({b.Op("frobnicate", {x})}), 1);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("function 'bad' op 0 (frobnicate)"), std::string::npos);
  }
  {
    NativeFunctionBuilder b("bad2");
    int x = b.Input({DType::kF32, Shape({2})});
    int y = b.Input({DType::kF32, Shape({3})});
    auto e = CompileNative(b.Build({b.Op("add", {x, y})}), 1);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    NativeFunctionBuilder b("bad3");
    int x = b.Input({DType::kF32, Shape({2})});
    EXPECT_FALSE(CompileNative(b.Build({b.Op("mul_scalar", {x})}), 1).ok());  // no attr
    EXPECT_FALSE(CompileNative(b.Build({b.Op("neg", {7})}), 1).ok());         // bad operand
    EXPECT_FALSE(CompileNative(b.Build({42}), 1).ok());                       // bad output
  }
  {
    NativeFunctionBuilder b("rs");
    int x = b.Input({DType::kF32, Shape({3})});
    EXPECT_FALSE(CompileNative(b.Build({b.Op("reduce_scatter_sum", {x})}), 2).ok());
  }
}

// Every op's result is a valid shape, and temp_bytes is what the results that are not outputs
// hold (checked against a device's memory at binding and by a worker).
TEST(NativeFunctionTest, IntermediatesAreValidatedAndCounted) {
  {
    NativeFunctionBuilder b("huge");
    const int64_t n = int64_t{1} << 25;  // [2^25,1] x [1,2^25]: 2^50 elements.
    int x = b.Input({DType::kF32, Shape({n, 1})});
    int y = b.Input({DType::kF32, Shape({1, n})});
    b.Op("matmul", {x, y});
    auto e = CompileNative(b.Build({x}), 1);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("function 'huge' op 0 (matmul)"), std::string::npos)
        << e.status();
    EXPECT_NE(e.status().message().find("more than 2^48 elements"), std::string::npos);
  }
  NativeFunctionBuilder b("temps");
  int x = b.Input({DType::kF32, Shape({4, 8})});
  int y = b.Input({DType::kF32, Shape({8, 2})});
  int m = b.Op("matmul", {x, y});  // f32[4,2]: 32 bytes, an output.
  int n = b.Op("neg", {x});        // f32[4,8]: 128 bytes, not one.
  int z = b.Op("mul_scalar", {n}, {{"value", 2}});  // 128 bytes, not one.
  (void)z;
  auto e = CompileNative(b.Build({m, x}), 1);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->temp_bytes(), 256);
}

TEST(NativeFunctionTest, WrongInputAtRunTime) {
  NativeFunctionBuilder b("f");
  int x = b.Input({DType::kF32, Shape({2})});
  auto exe = *CompileNative(b.Build({b.Op("neg", {x})}), 1);
  auto out = exe->ExecuteShard(Single({F32({1, 2, 3}, Shape({3}))})).Await();
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("function 'f' input 0"), std::string::npos);
}

TEST(NativeFunctionTest, IntegerDivisionByZeroIsAnError) {
  NativeFunctionBuilder b("d");
  int x = b.Input({DType::kS32, Shape({1})});
  auto exe = *CompileNative(b.Build({b.Op("div_scalar", {x}, {{"value", 0}})}), 1);
  int32_t one = 1;
  ShardLaunch l = Single({HostDeviceBuffer::FromHost({DType::kS32, Shape({1})}, DeviceId(0), &one)});
  EXPECT_EQ(exe->ExecuteShard(l).status().code(), absl::StatusCode::kInvalidArgument);
}

// Issue 20, item 3: INT32_MIN / -1 (and INT64_MIN / -1 by a scalar) trapped with SIGFPE and
// killed the worker; now an error naming the overflow.
TEST(NativeFunctionTest, IntegerDivisionOverflowIsAnErrorNotATrap) {
  NativeFunctionBuilder b("d");
  int x = b.Input({DType::kS32, Shape({2})});
  int y = b.Input({DType::kS32, Shape({2})});
  auto exe = *CompileNative(b.Build({b.Op("div", {x, y})}), 1);
  int32_t num[2] = {7, std::numeric_limits<int32_t>::min()}, den[2] = {2, -1};
  ShardLaunch l = Single({HostDeviceBuffer::FromHost({DType::kS32, Shape({2})}, DeviceId(0), num),
                          HostDeviceBuffer::FromHost({DType::kS32, Shape({2})}, DeviceId(0), den)});
  absl::Status s = exe->ExecuteShard(l).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("integer division overflow: -2147483648 / -1"), std::string::npos) << s;

  NativeFunctionBuilder b64("d64");
  int z = b64.Input({DType::kS64, Shape({1})});
  auto exe64 = *CompileNative(b64.Build({b64.Op("div_scalar", {z}, {{"value", -1}})}), 1);
  int64_t min64 = std::numeric_limits<int64_t>::min();
  ShardLaunch l64 =
      Single({HostDeviceBuffer::FromHost({DType::kS64, Shape({1})}, DeviceId(0), &min64)});
  EXPECT_EQ(exe64->ExecuteShard(l64).status().code(), absl::StatusCode::kInvalidArgument);
  int64_t eight = 8;  // Other quotients by -1 still work.
  ShardLaunch ok = Single({HostDeviceBuffer::FromHost({DType::kS64, Shape({1})}, DeviceId(0), &eight)});
  auto out = exe64->ExecuteShard(ok).Await();
  ASSERT_TRUE(out.ok()) << out.status();
  int64_t q = 0;
  ASSERT_TRUE((*out)[0]->CopyToHost(&q).status().ok());
  EXPECT_EQ(q, -8);
}

// Issue 20, item 2: a matmul with inner dimension 0 returned its output buffer unwritten (BLAS
// returns early), so a client read another client's freed memory; it is all zeros now.
TEST(NativeFunctionTest, MatmulWithAnEmptyInnerDimensionIsZeros) {
  NativeFunctionBuilder b("mm0");
  int a = b.Input({DType::kF32, Shape({3, 0})});
  int w = b.Input({DType::kF32, Shape({0, 4})});
  auto exe = *CompileNative(b.Build({b.Op("matmul", {a, w})}), 1);
  for (int round = 0; round < 3; ++round) {  // Fresh buffers from the allocator each time.
    auto garbage = HostDeviceBuffer::Create({DType::kF32, Shape({3, 4})}, DeviceId(0));
    std::memset(garbage->mutable_data(), 0x7f, 48);
    garbage.reset();
    auto out = exe->ExecuteShard(Single({F32({}, Shape({3, 0})), F32({}, Shape({0, 4}))})).Await();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Read((*out)[0]), std::vector<float>(12, 0.f));
  }
}

// Runs `exe` on n shards concurrently (one thread each, like device threads) and returns outputs.
std::vector<std::vector<float>> RunSpmd(const ExecutableRef& exe, Collectives& coll,
                                        std::vector<std::vector<float>> inputs, Shape s) {
  const int n = static_cast<int>(inputs.size());
  std::vector<std::vector<float>> outs(n);
  std::vector<std::thread> ts;
  std::vector<DeviceId> devs;
  for (int i = 0; i < n; ++i) devs.push_back(DeviceId(i));
  for (int i = 0; i < n; ++i) {
    ts.emplace_back([&, i] {
      ShardLaunch l;
      l.key = {1, 0, 0};
      l.rank = i;
      l.slice_devices = devs;
      l.device = devs[i];
      l.inputs = {F32(inputs[i], s, devs[i])};
      l.collectives = &coll;
      auto r = exe->ExecuteShard(l).Await();
      ASSERT_TRUE(r.ok()) << r.status();
      outs[i] = Read((*r)[0]);
    });
  }
  for (auto& t : ts) t.join();
  return outs;
}

ExecutableRef Collective(const std::string& kernel, Shape s, int n) {
  NativeFunctionBuilder b(kernel);
  int x = b.Input({DType::kF32, s});
  return *CompileNative(b.Build({b.Op(kernel, {x})}), n);
}

TEST(NativeFunctionTest, Collectives) {
  Collectives coll;
  auto ar = RunSpmd(Collective("all_reduce_sum", Shape({2}), 3), coll,
                    {{1, 2}, {10, 20}, {100, 200}}, Shape({2}));
  for (auto& o : ar) EXPECT_EQ(o, (std::vector<float>{111, 222}));
  Collectives coll2;
  auto ag = RunSpmd(Collective("all_gather", Shape({1}), 3), coll2, {{1}, {2}, {3}}, Shape({1}));
  for (auto& o : ag) EXPECT_EQ(o, (std::vector<float>{1, 2, 3}));
  Collectives coll3;
  auto rs = RunSpmd(Collective("reduce_scatter_sum", Shape({2}), 2), coll3, {{1, 2}, {10, 20}},
                    Shape({2}));
  EXPECT_EQ(rs[0], (std::vector<float>{11}));
  EXPECT_EQ(rs[1], (std::vector<float>{22}));
  Collectives coll4;
  auto a2a = RunSpmd(Collective("all_to_all", Shape({2}), 2), coll4, {{1, 2}, {10, 20}},
                     Shape({2}));
  EXPECT_EQ(a2a[0], (std::vector<float>{1, 10}));
  EXPECT_EQ(a2a[1], (std::vector<float>{2, 20}));
  EXPECT_EQ(coll.pending(), 0u);
}

TEST(NativeFunctionTest, AbortedDeviceFailsRendezvous) {
  Collectives coll;
  auto exe = Collective("all_reduce_sum", Shape({1}), 2);
  absl::Status seen;
  std::thread t([&] {
    ShardLaunch l;
    l.key = {9, 0, 0};
    l.rank = 0;
    l.slice_devices = kDevices01;
    l.device = DeviceId(0);
    l.inputs = {F32({1}, Shape({1}))};
    l.collectives = &coll;
    seen = exe->ExecuteShard(l).status();
  });
  while (coll.pending() == 0) std::this_thread::yield();
  coll.AbortDevice(DeviceId(1), absl::UnavailableError("device:1 removed"));
  t.join();
  EXPECT_EQ(seen.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(seen.message().find("device:1"), std::string::npos);
}

}  // namespace
}  // namespace pw
