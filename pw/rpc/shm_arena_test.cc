#include "pw/rpc/shm_arena.h"

#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace pw::rpc {
namespace {

TEST(ShmArenaTest, WriterFillsAReadersSegmentWhichIsReused) {
  ShmArena arena(/*max_segments=*/2);
  ShmWriterCache writer;
  EXPECT_EQ(arena.Take(), nullptr);  // Empty until it grows.
  ASSERT_TRUE(arena.Grow(3 << 20).ok());
  auto seg = arena.Take();
  ASSERT_NE(seg, nullptr);
  EXPECT_GE(seg->capacity(), size_t{3} << 20);
  const std::string data = "shard bytes";
  ASSERT_TRUE(writer.Write(seg->name(), data.data(), data.size()).ok());
  EXPECT_EQ(std::memcmp(seg->data(), data.data(), data.size()), 0);
  // Too big for it, or not an arena segment: refused with a reason.
  std::string big(seg->capacity() + 1, 'x');
  EXPECT_TRUE(absl::IsInvalidArgument(writer.Write(seg->name(), big.data(), big.size())));
  EXPECT_TRUE(absl::IsInvalidArgument(writer.Write("/etc-passwd", data.data(), data.size())));
  const std::string name = seg->name();
  arena.Give(seg);
  EXPECT_EQ(arena.Take()->name(), name);  // The same segment again.
}

TEST(ShmArenaTest, LimitsAndDiscardedSegments) {
  ShmArena arena(/*max_segments=*/1);
  ShmWriterCache writer;
  ASSERT_TRUE(arena.Grow(1 << 20).ok());
  auto held = arena.Take();
  // At its limit with nothing free: no room.
  EXPECT_TRUE(absl::IsResourceExhausted(arena.Grow(1 << 20)));
  arena.Discard(held);  // Unlinked: a writer that never mapped it cannot open it.
  EXPECT_TRUE(absl::IsNotFound(writer.Write(held->name(), "x", 1)));
  EXPECT_TRUE(arena.Grow(1 << 20).ok());  // Room again.
}

}  // namespace
}  // namespace pw::rpc
