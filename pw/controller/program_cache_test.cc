#include "pw/controller/program_cache.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using Cache = ProgramCache<std::string>;  // A plan here: the name of its layout.

std::shared_ptr<const std::string> PlanOf(const std::string& layout) {
  return std::make_shared<const std::string>(layout);
}
ProgramIr Ir(const std::string& name) {
  ProgramIr ir;
  ir.name = name;
  return ir;
}

TEST(ProgramCacheTest, APlanIsFoundOnlyByItsOwnerAndLayout) {
  Cache c(/*max_plans=*/4, /*max_programs_per_owner=*/8);
  ProgramId id = *c.Add(ClientId(1), Ir("step"), "f32[8]", PlanOf("f32[8]"));
  std::optional<Cache::Found> hit = c.Find(ClientId(1), id, "f32[8]");
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit->plan, "f32[8]");
  std::optional<Cache::Found> miss = c.Find(ClientId(1), id, "f32[16]");
  ASSERT_TRUE(miss.has_value());
  EXPECT_EQ(miss->plan, nullptr);  // Lower it: the program comes back.
  EXPECT_EQ(miss->ir.name, "step");
  EXPECT_FALSE(c.Find(ClientId(2), id, "f32[8]").has_value());  // Not its program.
  EXPECT_FALSE(c.Find(ClientId(1), ProgramId(7), "f32[8]").has_value());
  EXPECT_EQ(c.AnyPlan(ClientId(2), id), nullptr);
  EXPECT_NE(*c.Add(ClientId(1), Ir("other"), "x", PlanOf("x")), id);  // Ids are not reused.
}

TEST(ProgramCacheTest, TheLeastRecentlyUsedLayoutIsEvictedPastTheLimit) {
  Cache c(/*max_plans=*/2, /*max_programs_per_owner=*/8);
  ProgramId id = *c.Add(ClientId(1), Ir("step"), "a", PlanOf("a"));
  ASSERT_EQ(c.Keep(ClientId(1), id, "b", PlanOf("b")), std::optional<Cache::PlanPtr>(nullptr));
  ASSERT_NE(c.Find(ClientId(1), id, "a")->plan, nullptr);  // "a" is now the more recent.
  std::optional<Cache::PlanPtr> evicted = c.Keep(ClientId(1), id, "c", PlanOf("c"));
  ASSERT_TRUE(evicted.has_value() && *evicted != nullptr);
  EXPECT_EQ(**evicted, "b");
  EXPECT_EQ(c.Find(ClientId(1), id, "b")->plan, nullptr);
  EXPECT_NE(c.Find(ClientId(1), id, "a")->plan, nullptr);
  EXPECT_EQ(c.plans(), 2u);
  // Keeping a layout it has replaces that plan and evicts nothing.
  evicted = c.Keep(ClientId(1), id, "a", PlanOf("a2"));
  EXPECT_EQ(evicted, std::optional<Cache::PlanPtr>(nullptr));
  EXPECT_EQ(*c.Find(ClientId(1), id, "a")->plan, "a2");
  // Another client cannot add to it.
  EXPECT_FALSE(c.Keep(ClientId(2), id, "d", PlanOf("d")).has_value());
}

TEST(ProgramCacheTest, AClientsProgramsGoWithItAndGiveBackTheirPlans) {
  Cache c(/*max_plans=*/4, /*max_programs_per_owner=*/8);
  ProgramId mine = *c.Add(ClientId(1), Ir("mine"), "a", PlanOf("a"));
  (void)c.Keep(ClientId(1), mine, "b", PlanOf("b"));
  ProgramId theirs = *c.Add(ClientId(2), Ir("theirs"), "a", PlanOf("z"));
  std::vector<Cache::PlanPtr> dropped = c.DropClient(ClientId(1));
  std::vector<std::string> names;
  for (const auto& p : dropped) names.push_back(*p);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("a", "b"));
  EXPECT_EQ(c.programs(), 1u);
  EXPECT_EQ(c.plans(), 1u);
  EXPECT_FALSE(c.Find(ClientId(1), mine, "a").has_value());
  // The client left while a plan was lowered: keeping it fails.
  EXPECT_FALSE(c.Keep(ClientId(1), mine, "c", PlanOf("c")).has_value());
  EXPECT_EQ(*c.AnyPlan(ClientId(2), theirs), "z");
}

// A client holds at most its limit of programs; others are unaffected, and leaving frees its
// room.
TEST(ProgramCacheTest, AClientHoldsAtMostItsLimitOfPrograms) {
  Cache c(/*max_plans=*/4, /*max_programs_per_owner=*/2);
  ASSERT_TRUE(c.Add(ClientId(1), Ir("a"), "x", PlanOf("x")).ok());
  EXPECT_FALSE(c.Full(ClientId(1)));
  ASSERT_TRUE(c.Add(ClientId(1), Ir("b"), "x", PlanOf("x")).ok());
  EXPECT_TRUE(c.Full(ClientId(1)));
  absl::StatusOr<ProgramId> third = c.Add(ClientId(1), Ir("c"), "x", PlanOf("x"));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), ::testing::HasSubstr("client:1 has 2 programs"));
  EXPECT_EQ(c.programs(), 2u);
  EXPECT_TRUE(c.Add(ClientId(2), Ir("theirs"), "x", PlanOf("x")).ok());
  (void)c.DropClient(ClientId(1));
  EXPECT_FALSE(c.Full(ClientId(1)));
}

}  // namespace
}  // namespace pw
