#include "pw/dataplane/shm_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pw::dataplane {
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

// Issue 23: under many concurrent fetches a reader found its pool empty, used a fresh segment,
// then grew the pool, which at its limit unlinked a free segment of the same size to map a new
// one (page faults on both sides, on every call): growing keeps a free segment that fits.
TEST(ShmArenaTest, GrowingKeepsTheFreeSegmentsWhenOneFits) {
  ShmArena arena(/*max_segments=*/2);
  ASSERT_TRUE(arena.Grow(1 << 20).ok());
  ASSERT_TRUE(arena.Grow(1 << 20).ok());
  auto a = arena.Take(), b = arena.Take();
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const std::set<std::string> names = {a->name(), b->name()};
  arena.Give(std::move(a));
  arena.Give(std::move(b));
  EXPECT_TRUE(arena.Grow(1000).ok());  // A free one is big enough: nothing to make.
  a = arena.Take();
  b = arena.Take();
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_EQ((std::set<std::string>{a->name(), b->name()}), names);
  // A larger shard still replaces a smaller free segment.
  arena.Give(std::move(a));
  EXPECT_TRUE(arena.Grow(3 << 20).ok());
  EXPECT_GE(arena.Take()->capacity(), size_t{3} << 20);
}

// Issue 20: a failed worker's stub kept its reader's pool (each segment at least 1 MiB, resident)
// for as long as the controller ran, so every rejoin grew the controller.
TEST(ShmArenaTest, ClosingFreesTheSegmentsFreeNowAndThoseGivenBackLater) {
  ShmArena arena(/*max_segments=*/2);
  ShmWriterCache writer;
  ASSERT_TRUE(arena.Grow(1 << 20).ok());
  ASSERT_TRUE(arena.Grow(1 << 20).ok());
  auto taken = arena.Take();  // One taken, one free.
  ASSERT_NE(taken, nullptr);
  auto other = arena.Take();
  ASSERT_NE(other, nullptr);
  const std::string free_name = other->name();
  arena.Give(std::move(other));
  arena.Close();
  EXPECT_TRUE(absl::IsNotFound(writer.Write(free_name, "x", 1))) << "a free segment survived";
  const std::string taken_name = taken->name();
  arena.Give(std::move(taken));  // Comes back after the close: unlinked, not pooled.
  EXPECT_TRUE(absl::IsNotFound(writer.Write(taken_name, "x", 1)));
  EXPECT_EQ(arena.Take(), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(arena.Grow(1 << 20)));
}

}  // namespace
}  // namespace pw::dataplane
