#include "pw/base/sharding.h"

#include <numeric>

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(ShardingTest, SplitBoxes) {
  Sharding s = Sharding::Split({4}, 2, /*dim=*/0);
  Shape g({8, 3});
  ASSERT_TRUE(s.Validate(g).ok());
  EXPECT_EQ(s.ShardShape(g), Shape({2, 3}));
  Box b = s.ShardBox(g, 2);
  EXPECT_EQ(b.start, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(b.limit, (std::vector<int64_t>{6, 3}));
}

TEST(ShardingTest, TwoDimensionalMesh) {
  Sharding s({2, 2}, {1, 0});  // dim0 along axis 1, dim1 along axis 0.
  Shape g({4, 6});
  ASSERT_TRUE(s.Validate(g).ok());
  Box b = s.ShardBox(g, 1);  // mesh coord (0, 1)
  EXPECT_EQ(b.start, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(b.limit, (std::vector<int64_t>{4, 3}));
}

TEST(ShardingTest, ValidateErrors) {
  EXPECT_FALSE(Sharding::Split({3}, 1, 0).Validate(Shape({4})).ok());  // not divisible
  EXPECT_FALSE(Sharding({2}, {0, 0}).Validate(Shape({2, 2})).ok());    // axis twice
  EXPECT_FALSE(Sharding({2}, {1}).Validate(Shape({2})).ok());          // axis out of range
  EXPECT_FALSE(Sharding({2}, {0}).Validate(Shape({2, 2})).ok());       // rank mismatch
  EXPECT_FALSE(Sharding({}, {}).Validate(Shape()).ok());               // empty mesh
  EXPECT_TRUE(Sharding::Replicated({4}, 2).IsReplicated());
}

TEST(ShardingTest, ReshardByBoxCopies) {
  // Global 4x4 iota; shards split by rows over 2, re-assembled into column shards over 2.
  Shape g({4, 4});
  std::vector<float> global(16);
  std::iota(global.begin(), global.end(), 0.f);
  Sharding rows = Sharding::Split({2}, 2, 0), cols = Sharding::Split({2}, 2, 1);
  std::vector<std::vector<float>> row_shards(2, std::vector<float>(8));
  Box whole{{0, 0}, {4, 4}};
  for (int i = 0; i < 2; ++i)
    CopyBoxIntersection(global.data(), whole, row_shards[i].data(), rows.ShardBox(g, i), 4);
  std::vector<float> col1(8);
  int64_t copied = 0;
  for (int i = 0; i < 2; ++i)
    copied += CopyBoxIntersection(row_shards[i].data(), rows.ShardBox(g, i), col1.data(),
                                  cols.ShardBox(g, 1), 4);
  EXPECT_EQ(copied, 8);
  EXPECT_EQ(col1, (std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15}));
}

// Issue 20, item 1: a box of rank 60,001 overflowed the stack of the recursive copy (the
// controller crashed on one PutArray). The copy is iterative now; the wire also refuses ranks
// over Shape::kMaxRank (wire_test).
TEST(ShardingTest, CopyOfAVeryHighRankBoxDoesNotRecurse) {
  const int rank = 60001;
  Box whole{std::vector<int64_t>(rank, 0), std::vector<int64_t>(rank, 1)};
  whole.limit[0] = 2;
  const double src[2] = {1.5, -2.5};
  double dst[2] = {0, 0};
  EXPECT_EQ(CopyBoxIntersection(src, whole, dst, whole, sizeof(double)), 2);
  EXPECT_EQ(dst[1], -2.5);
  // A 3-D intersection with offsets in every dimension, row by row.
  std::vector<int> big(4 * 3 * 5);
  std::iota(big.begin(), big.end(), 0);
  Box src3{{0, 0, 0}, {4, 3, 5}}, dst3{{1, 1, 2}, {3, 3, 5}};
  std::vector<int> part(2 * 2 * 3, -1);
  EXPECT_EQ(CopyBoxIntersection(big.data(), src3, part.data(), dst3, sizeof(int)), 12);
  EXPECT_EQ(part, (std::vector<int>{22, 23, 24, 27, 28, 29, 37, 38, 39, 42, 43, 44}));
}

TEST(ShapeTest, RankIsLimitedAndNamedWithoutPrintingTheShape) {
  EXPECT_TRUE(Shape(std::vector<int64_t>(Shape::kMaxRank, 1)).Validate().ok());
  absl::Status s = Shape(std::vector<int64_t>(60001, 1)).Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "shape of rank 60001 exceeds the limit of 64 dimensions");
}

}  // namespace
}  // namespace pw
