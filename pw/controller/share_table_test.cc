#include "pw/controller/share_table.h"

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

TEST(ShareTableTest, TokensAreUnguessableAndNameTheBufferTheyPointAtNow) {
  ShareTable t;
  ClientId owner(1), a(2), b(3);
  absl::flat_hash_set<std::string> tokens;
  for (int i = 0; i < 100; ++i) tokens.insert(*t.Create(owner, BufferId(i), false));
  EXPECT_EQ(tokens.size(), 100u);
  const std::string tok = *t.Create(owner, BufferId(7), /*writable=*/false);
  EXPECT_EQ(*t.Import(a, tok), BufferId(7));
  EXPECT_EQ(t.Repoint(a, tok, BufferId(8)).code(), absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(t.Repoint(owner, tok, BufferId(8)).ok());
  EXPECT_EQ(*t.Import(b, tok), BufferId(8));
  const std::string rw = *t.Create(owner, BufferId(1), /*writable=*/true);
  ASSERT_TRUE(t.Repoint(a, rw, BufferId(2)).ok());
  EXPECT_EQ(*t.Import(b, rw), BufferId(2));
  EXPECT_EQ(t.Revoke(a, tok).status().code(), absl::StatusCode::kPermissionDenied);
  auto imports = t.Revoke(owner, tok);
  ASSERT_TRUE(imports.ok());
  EXPECT_THAT(*imports, UnorderedElementsAre(Pair(a, BufferId(7)), Pair(b, BufferId(8))));
  auto gone = t.Import(a, tok);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("revoked, or its owner has disconnected"));
  t.ForgetOwner(owner);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.Import(b, rw).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Import(b, std::string(65, 'p')).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShareTableTest, EachClientOwnsAtMostTheLimitOfShares) {
  ShareTable t;
  ClientId c(1);
  std::string last;
  for (size_t i = 0; i < ShareTable::kMaxSharesPerClient; ++i) last = *t.Create(c, BufferId(0), false);
  auto over = t.Create(c, BufferId(0), false);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("1024 shares, the limit"));
  EXPECT_TRUE(t.Create(ClientId(2), BufferId(0), false).ok()) << "another client's count";
  ASSERT_TRUE(t.Revoke(c, last).ok());
  EXPECT_TRUE(t.Create(c, BufferId(0), false).ok());
}

}  // namespace
}  // namespace pw
