#include "pw/controller/output_ids.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

const ClientId kA(1), kB(2);

TEST(OutputIdsTest, IdsOfALeaseAreClaimedOnceInIncreasingOrderByItsClientAlone) {
  OutputIds ids;
  ASSERT_TRUE(ids.Lease(kA, BufferId(100), 4).ok());
  EXPECT_TRUE(ids.Claim(kA, {BufferId(100), BufferId(101)}).ok());
  // Used already, or below what was claimed.
  EXPECT_THAT(ids.Claim(kA, {BufferId(101)}).message(), HasSubstr("output id buffer:101"));
  EXPECT_TRUE(absl::IsInvalidArgument(ids.Claim(kA, {BufferId(100)})));
  // Another client's, or no one's.
  EXPECT_TRUE(absl::IsInvalidArgument(ids.Claim(kB, {BufferId(102)})));
  EXPECT_TRUE(absl::IsInvalidArgument(ids.Claim(kA, {BufferId(104)})));
  EXPECT_TRUE(absl::IsInvalidArgument(ids.Claim(kA, {BufferId(-1)})));
  EXPECT_TRUE(ids.Claim(kA, {BufferId(103)}).ok());  // Skipping 102 is fine...
  EXPECT_FALSE(ids.Claim(kA, {BufferId(102)}).ok());  // ...but it cannot come back.
}

TEST(OutputIdsTest, LeasesAreBoundedAndCloseWhenUsedUpOrBurnt) {
  OutputIds ids;
  EXPECT_TRUE(absl::IsInvalidArgument(ids.CheckLease(kA, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(ids.CheckLease(kA, OutputIds::kMaxLeaseIds + 1)));
  for (size_t i = 0; i < OutputIds::kMaxOpenLeases; ++i)
    ASSERT_TRUE(ids.Lease(kA, BufferId(10 * static_cast<int64_t>(i)), 2).ok());
  absl::Status full = ids.CheckLease(kA, 2);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_TRUE(ids.CheckLease(kB, 2).ok());  // Per client.
  // The last id claimed closes a lease; a failed run's ids are burnt (claimed where they can be).
  EXPECT_TRUE(ids.Claim(kA, {BufferId(0), BufferId(1)}).ok());
  EXPECT_TRUE(ids.CheckLease(kA, 2).ok());
  ASSERT_TRUE(ids.Lease(kA, BufferId(1000), 2).ok());
  EXPECT_FALSE(ids.CheckLease(kA, 2).ok());
  ids.Burn(kA, {BufferId(999), BufferId(1000), BufferId(1001)});
  EXPECT_TRUE(ids.CheckLease(kA, 2).ok());
  ids.Drop(kA);
  EXPECT_FALSE(ids.Claim(kA, {BufferId(10)}).ok());
}

TEST(OutputIdsTest, AFailedRunsIdsRememberWhyUntilReleasedAndTheOldestGoFirst) {
  OutputIds ids;
  ids.Failed(kA, {BufferId(5), BufferId(6)}, absl::NotFoundError("argument 0 is gone"));
  ASSERT_TRUE(ids.FailureOf(kA, BufferId(6)).has_value());
  EXPECT_THAT(ids.FailureOf(kA, BufferId(6))->message(), HasSubstr("argument 0 is gone"));
  EXPECT_FALSE(ids.FailureOf(kB, BufferId(6)).has_value());  // Not another client's.
  EXPECT_TRUE(ids.Forget(kA, BufferId(6)));
  EXPECT_FALSE(ids.Forget(kA, BufferId(6)));
  EXPECT_FALSE(ids.FailureOf(kA, BufferId(6)).has_value());
  for (int64_t i = 0; i < static_cast<int64_t>(OutputIds::kMaxFailuresRemembered); ++i)
    ids.Failed(kA, {BufferId(100 + i)}, absl::InternalError("x"));
  EXPECT_FALSE(ids.FailureOf(kA, BufferId(5)).has_value());  // The oldest went.
  EXPECT_TRUE(ids.FailureOf(kA, BufferId(100)).has_value());
}

}  // namespace
}  // namespace pw
