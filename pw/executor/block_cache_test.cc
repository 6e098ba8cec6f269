#include "pw/executor/block_cache.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "pw/executor/device_buffer.h"

namespace pw {
namespace {

void* Block(size_t bytes) { return std::aligned_alloc(64, bytes); }

TEST(BlockCacheTest, ABlockOfTheSameSizeComesBackOthersDoNot) {
  BlockCache cache({});
  void* a = Block(1 << 20);
  cache.Keep(a, 1 << 20);
  EXPECT_EQ(cache.cached_bytes(), size_t{1} << 20);
  EXPECT_EQ(cache.Take(2 << 20), nullptr);
  EXPECT_EQ(cache.Take(1 << 20), a);
  EXPECT_EQ(cache.Take(1 << 20), nullptr);  // Taken once.
  EXPECT_EQ(cache.cached_bytes(), 0u);
  std::free(a);
}

TEST(BlockCacheTest, TheOldestGoOverTheLimitAndABlockOverItIsNotKept) {
  BlockCache cache({.max_bytes = 3 << 20});
  void* a = Block(1 << 20);
  void* b = Block(2 << 20);
  void* c = Block(1 << 20);
  cache.Keep(a, 1 << 20);
  cache.Keep(b, 2 << 20);
  cache.Keep(c, 1 << 20);  // 4 MiB: the oldest, a, is freed.
  EXPECT_EQ(cache.cached_bytes(), size_t{3} << 20);
  EXPECT_EQ(cache.Take(1 << 20), c);
  cache.Keep(Block(4 << 20), 4 << 20);  // Alone over the limit: freed at once.
  EXPECT_EQ(cache.cached_bytes(), size_t{2} << 20);
  EXPECT_EQ(cache.Take(2 << 20), b);
  std::free(b);
  std::free(c);
}

TEST(BlockCacheTest, BlocksIdleTooLongAreFreed) {
  int64_t now = 0;
  BlockCache cache({.max_idle = absl::Seconds(10), .now_ns = [&] { return now; }});
  cache.Keep(Block(1 << 20), 1 << 20);
  now += 5'000'000'000;
  void* fresh = Block(1 << 20);
  cache.Keep(fresh, 1 << 20);
  now += 6'000'000'000;  // The first is 11 s idle, the second 6 s.
  cache.Trim();
  EXPECT_EQ(cache.cached_bytes(), size_t{1} << 20);
  EXPECT_EQ(cache.Take(1 << 20), fresh);
  std::free(fresh);
}

// A large host buffer's block serves the next buffer of its size: no fresh memory each time.
TEST(BlockCacheTest, ALargeHostBufferReusesTheBlockOfOneFreedBefore) {
  const ArraySpec spec{DType::kF32, Shape({3 << 20})};  // 12 MiB.
  const void* first;
  {
    auto b = HostDeviceBuffer::Create(spec, DeviceId(0));
    first = b->data();
  }
  auto again = HostDeviceBuffer::Create(spec, DeviceId(0));
  EXPECT_EQ(again->data(), first);
  auto other = HostDeviceBuffer::Create(spec, DeviceId(0));  // The block is in use.
  EXPECT_NE(other->data(), first);
}

}  // namespace
}  // namespace pw
