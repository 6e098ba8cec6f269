#include "pw/base/heap.h"

#include "gtest/gtest.h"

namespace pw {
namespace {

// Memory goes back only after large transients, on that tick and a few after (the buffers are
// freed when their calls end), then no more until the next large ones.
TEST(HeapTest, ReleasesOnlyAfterLargeTransientsForAFewTicks) {
  while (ReleaseFreeMemoryAfterTransients()) {
  }
  CountTransientBytes(kReleaseAfterTransientBytes / 2);
  EXPECT_FALSE(ReleaseFreeMemoryAfterTransients());
  CountTransientBytes(kReleaseAfterTransientBytes / 2);
  int releases = 0;
  while (ReleaseFreeMemoryAfterTransients()) ++releases;
  EXPECT_EQ(releases, 5);
  EXPECT_FALSE(ReleaseFreeMemoryAfterTransients());
  CountTransientBytes(-1);  // Ignored.
  CountTransientBytes(0);
  EXPECT_FALSE(ReleaseFreeMemoryAfterTransients());
}

}  // namespace
}  // namespace pw
