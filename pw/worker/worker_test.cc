#include "pw/worker/worker.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/executor/device_buffer.h"
#include "pw/executor/native_function.h"

namespace pw {
namespace {

// A clock that stands still until the test moves it, counting its reads.
struct FakeClock {
  std::atomic<int64_t> now{1'000'000'000};
  std::atomic<int> reads{0};
  std::function<int64_t()> Fn() {
    return [this] {
      reads.fetch_add(1);
      return now.load();
    };
  }
};

// A device's time for a work counts its launches, not what it waited for before them: a step
// whose input arrives a (fake) second after the device reached it took no time.
TEST(WorkerTest, DeviceTimeExcludesWaitingForAnInput) {
  const DeviceId dev(0);
  FakeClock clock;  // Outlives the worker.
  Collectives collectives;
  Worker worker(HostId(0), IslandId(0), {DeviceSpec{dev, HostId(0), IslandId(0), 0, 1 << 20}},
                &collectives, [](HostId) -> WorkerInterface* { return nullptr; });
  worker.SetClockForTesting(clock.Fn());

  const ArraySpec spec{DType::kF32, Shape({4})};
  NativeFunctionBuilder b("negate");
  const int x = b.Input(spec);
  ASSERT_TRUE(worker.LoadFunction(FunctionId(1), b.Build({b.Op("neg", {x})})).status().ok());

  Promise<DeviceBufferRef> input;
  ASSERT_TRUE(worker.PutShardLater(BufferId(1), dev, spec, input.future()).IsReady() == false);
  auto program = std::make_shared<HostProgram>();
  program->id = 1;
  program->program = "p";
  ComputeWork compute{FunctionId(1), std::make_shared<const std::vector<DeviceId>>(1, dev), {0},
                      {0}, {1}, {}};
  program->nodes.push_back(NodeWork{0, "negate", compute});
  HostWork work{RunId(1), ClientId(1), program,
                std::make_shared<const std::vector<BufferId>>(
                    std::vector<BufferId>{BufferId(1), BufferId(2)}),
                0, 1};
  DispatchAck ack = worker.Dispatch(std::move(work));
  ASSERT_TRUE(ack.enqueued.status().ok());
  // The device has its segment; a clock read made before the input arrives is one a wait would
  // be measured from (the device waits meanwhile whether it reads or not).
  Device* device = worker.FindDevice(dev);
  while (device->queue_depth() == 0 && !ack.done.IsReady()) std::this_thread::yield();
  for (absl::Time until = absl::Now() + absl::Milliseconds(100);
       clock.reads.load() == 0 && absl::Now() < until;)
    std::this_thread::yield();
  clock.now += 1'000'000'000;
  std::vector<float> values = {1, 2, 3, 4};
  input.Set(DeviceBufferRef(HostDeviceBuffer::FromHost(spec, dev, values.data())));

  ASSERT_TRUE(ack.done.status().ok()) << ack.done.status();
  EXPECT_EQ(*ack.done.Await(), 0);  // Not the second it waited.
  EXPECT_GE(clock.reads.load(), 2);  // The launch was timed.
}

// A function whose intermediate values can never fit its device fails its run, naming the bytes
// and the device's memory, and the worker goes on (before, the device thread aborted the process
// allocating 4 TiB).
TEST(WorkerTest, IntermediatesLargerThanTheDeviceFailTheRunNotTheWorker) {
  const DeviceId dev(0);
  Collectives collectives;
  Worker worker(HostId(0), IslandId(0), {DeviceSpec{dev, HostId(0), IslandId(0), 0, 16 << 20}},
                &collectives, [](HostId) -> WorkerInterface* { return nullptr; });
  const int64_t n = int64_t{1} << 20;
  NativeFunctionBuilder b("outer");
  const int x = b.Input({DType::kF32, Shape({n, 1})});
  const int y = b.Input({DType::kF32, Shape({1, n})});
  b.Op("matmul", {x, y});  // f32[2^20,2^20]: 4 TiB, never an output.
  ASSERT_TRUE(worker.LoadFunction(FunctionId(1), b.Build({b.Op("neg", {x})})).status().ok());
  for (int i = 0; i < 2; ++i) {
    const ArraySpec spec = i == 0 ? ArraySpec{DType::kF32, Shape({n, 1})}
                                  : ArraySpec{DType::kF32, Shape({1, n})};
    HostArray zeros{spec, Bytes(spec.size_bytes(), 0)};
    ASSERT_TRUE(worker.PutShard(BufferId(i + 1), dev, std::move(zeros)).status().ok());
  }
  auto program = std::make_shared<HostProgram>();
  program->id = 1;
  program->program = "p";
  ComputeWork compute{FunctionId(1), std::make_shared<const std::vector<DeviceId>>(1, dev), {0},
                      {0, 1}, {2}, {}};
  program->nodes.push_back(NodeWork{0, "outer", compute});
  HostWork work{RunId(1), ClientId(1), program,
                std::make_shared<const std::vector<BufferId>>(
                    std::vector<BufferId>{BufferId(1), BufferId(2), BufferId(3)}),
                0, 1};
  DispatchAck ack = worker.Dispatch(std::move(work));
  const absl::Status done = ack.done.status();
  EXPECT_TRUE(absl::IsResourceExhausted(done)) << done;
  EXPECT_THAT(std::string(done.message()), ::testing::HasSubstr("4398046511104"));
  // The output is failed, not missing, and the device serves the next work.
  auto out = worker.FetchShard(BufferId(3), dev);
  EXPECT_FALSE(out.status().ok());
  EXPECT_TRUE(worker.FindDevice(dev)->health().ok());
}

}  // namespace
}  // namespace pw
