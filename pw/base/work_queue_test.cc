#include "pw/base/work_queue.h"

#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(WorkQueueTest, RunsInOrderAndDrainsOnDestruction) {
  std::vector<int> seen;
  {
    WorkQueue q("test");
    for (int i = 0; i < 1000; ++i) q.Post([&seen, i] { seen.push_back(i); });
  }
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], i);
}

}  // namespace
}  // namespace pw
