#include "pw/base/shape.h"

#include "gtest/gtest.h"
#include "pw/base/dtype.h"

namespace pw {
namespace {

TEST(ShapeTest, ElementsAndStrings) {
  EXPECT_EQ(Shape().num_elements(), 1);
  EXPECT_EQ(Shape({2, 3}).num_elements(), 6);
  EXPECT_EQ(Shape({2, 0}).num_elements(), 0);
  EXPECT_EQ(Shape({2, 3}).ToString(), "[2,3]");
  ArraySpec s{DType::kF32, Shape({4})};
  EXPECT_EQ(s.size_bytes(), 16);
  EXPECT_EQ(s.ToString(), "f32[4]");
}

TEST(ShapeTest, ValidateRejectsNegativeAndMissingDtype) {
  EXPECT_FALSE(Shape({2, -1}).Validate().ok());
  EXPECT_FALSE(Shape({int64_t{1} << 62, 4}).Validate().ok());  // Element count overflows.
  EXPECT_FALSE(Shape({int64_t{1} << 40, int64_t{1} << 10}).Validate().ok());
  // Issue 20: zero elements, absurd dimensions ([0, 2^62, 2^62] was accepted and stored).
  EXPECT_FALSE(Shape({0, int64_t{1} << 62, int64_t{1} << 62}).Validate().ok());
  EXPECT_TRUE(Shape({0, int64_t{1} << 48}).Validate().ok());
  EXPECT_FALSE((ArraySpec{DType::kInvalid, Shape({1})}.Validate().ok()));
  EXPECT_TRUE((ArraySpec{DType::kS32, Shape({1})}.Validate().ok()));
}

TEST(DTypeTest, NamesRoundTripAndEveryTypeHasASize) {
  for (int i = static_cast<int>(DType::kPred); i <= static_cast<int>(DType::kLast); ++i) {
    const DType t = static_cast<DType>(i);
    auto back = DTypeFromName(DTypeName(t));
    ASSERT_TRUE(back.ok()) << i;
    EXPECT_EQ(*back, t);
    EXPECT_GT(DTypeSize(t), 0u) << DTypeName(t);
  }
  EXPECT_FALSE(DTypeFromName("f31").ok());
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kC64), 8u);
  EXPECT_EQ(DTypeSize(DType::kS16), 2u);
  EXPECT_EQ(DTypeName(DType::kU64), "u64");
}

}  // namespace
}  // namespace pw

#include "pw/base/host_array.h"

namespace pw {
namespace {
TEST(HostArrayTest, RendersLikeNumpy) {
  auto a = HostArray::Of<float>(DType::kF32, Shape({2}), {3.f, 5.f});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ToString(), "array([3., 5.])");
  auto b = HostArray::Of<int32_t>(DType::kS32, Shape({2, 2}), {1, 2, 3, 4});
  EXPECT_EQ(b->ToString(), "array([[1, 2], [3, 4]])");
  EXPECT_FALSE(HostArray::Of<float>(DType::kF32, Shape({3}), {1.f}).ok());
  EXPECT_FALSE(HostArray::Of<double>(DType::kF32, Shape({1}), {1.0}).ok());
}
}  // namespace
}  // namespace pw
