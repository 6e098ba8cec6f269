#include "pw/program/lowering.h"

#include "gtest/gtest.h"
#include "pw/executor/native_function.h"

namespace pw {
namespace {

// Real resource manager and native compiler behind the lowering interface.
class TestContext : public LoweringContext {
 public:
  TestContext() : rm_(*ClusterSpec::Uniform(2, 1, 2, 1 << 20)) {}
  absl::StatusOr<SliceInfo> ResolveSlice(SliceId s) const override {
    return rm_.ResolveSlice(client_, s);
  }
  absl::StatusOr<FunctionSignature> LoadSignature(FunctionId f, int n) const override {
    if (!f.valid() || f.value() >= static_cast<int64_t>(fns_.size()))
      return absl::NotFoundError(absl::StrCat(f.ToString(), " is not registered"));
    return SignatureOf(fns_[f.value()], n);
  }
  FunctionId Add(NativeFunctionDef d) {
    fns_.push_back(std::move(d));
    return FunctionId(static_cast<int64_t>(fns_.size()) - 1);
  }
  SliceInfo Slice(int n, bool one_island = true) {
    return *rm_.AllocateSlice(client_, {.num_devices = n, .placement = one_island
                                                                ? SlicePlacement::kIsland
                                                                : SlicePlacement::kSpread});
  }
  ResourceManager rm_;
  ClientId client_{1};
  std::vector<NativeFunctionDef> fns_;
};

NativeFunctionDef Scalar(const std::string& name, const std::string& kernel, double v) {
  NativeFunctionBuilder b(name);
  int x = b.Input({DType::kF32, Shape({1})});
  return b.Build({b.Op(kernel, {x}, {{"value", v}})});
}

// pmap-style binding on a slice of n: global f32[n], split on dim 0.
Binding Pmap(FunctionId f, const SliceInfo& s) {
  int n = static_cast<int>(s.devices.size());
  ArraySpec g{DType::kF32, Shape({n})};
  Sharding sh = Sharding::Split({n}, 1, 0);
  return {f, s.id, {g}, {sh}, {g}, {sh}};
}

Placement ArgOn(const SliceInfo& s) {
  int n = static_cast<int>(s.devices.size());
  return PlacementOn(s, {DType::kF32, Shape({n})}, Sharding::Split({n}, 1, 0));
}

TEST(LoweringTest, ChainOnOneSliceIsFourNodes) {
  TestContext ctx;
  auto s = ctx.Slice(2);
  FunctionId a = ctx.Add(Scalar("a", "mul_scalar", 2)), b = ctx.Add(Scalar("b", "add_scalar", 1));
  ProgramIr ir{"ab", {{DType::kF32, Shape({2})}},
               {{"A", Pmap(a, s), {{ValueRef::kArgNode, 0}}}, {"B", Pmap(b, s), {{0, 0}}}},
               {{1, 0}}};
  auto lp = Lower(ir, {ArgOn(s)}, ctx);
  ASSERT_TRUE(lp.ok()) << lp.status();
  EXPECT_EQ(lp->nodes.size(), 4u) << lp->ToString();
  EXPECT_EQ(lp->num_compute(), 2);
  EXPECT_EQ(lp->num_transfers(), 0);
  EXPECT_EQ(lp->device_bytes.at(s.devices[0]), 8);  // Two f32[1] shards.
}

TEST(LoweringTest, LongChainReleasesEachIntermediateAtItsReader) {
  TestContext ctx;
  auto s = ctx.Slice(2);
  FunctionId b = ctx.Add(Scalar("b", "add_scalar", 1));
  ProgramIr ir{"chain", {{DType::kF32, Shape({2})}}, {}, {}};
  for (int i = 0; i < 6; ++i)
    ir.nodes.push_back({"B", Pmap(b, s), {{i == 0 ? ValueRef::kArgNode : i - 1, 0}}});
  ir.outputs = {{5, 0}};
  auto lp = Lower(ir, {ArgOn(s)}, ctx);
  ASSERT_TRUE(lp.ok()) << lp.status();
  // Two f32[1] shards at a time (a node's input and output), not six.
  EXPECT_EQ(lp->device_bytes.at(s.devices[0]), 8);
  int released = 0;
  for (const LoweredNode& n : lp->nodes) {
    if (n.kind != LoweredNode::Kind::kCompute) continue;
    // Each node after the first drops the intermediate it read; the argument is kept.
    for (int v : n.release) {
      EXPECT_EQ(lp->values[v].arg, -1);
      EXPECT_EQ(n.inputs, std::vector<int>{v});
      ++released;
    }
  }
  EXPECT_EQ(released, 5);
}

TEST(LoweringTest, TransfersBetweenSlicesUseIciOrDcn) {
  TestContext ctx;
  auto s0 = ctx.Slice(2);  // island 0
  auto s1 = ctx.Slice(2);  // island 1 (least loaded)
  auto s2 = ctx.Slice(2);  // island 0 or 1, same devices as one of the above
  ASSERT_NE(s0.islands, s1.islands);
  FunctionId a = ctx.Add(Scalar("a", "mul_scalar", 2));
  ProgramIr ir{"x", {{DType::kF32, Shape({2})}},
               {{"on0", Pmap(a, s0), {{ValueRef::kArgNode, 0}}},
                {"on1", Pmap(a, s1), {{0, 0}}},
                {"on1again", Pmap(a, s1), {{0, 0}}}},
               {{1, 0}, {2, 0}}};
  auto lp = Lower(ir, {ArgOn(s0)}, ctx);
  ASSERT_TRUE(lp.ok()) << lp.status();
  ASSERT_EQ(lp->num_transfers(), 1) << "one transfer feeds both consumers\n" << lp->ToString();
  for (const auto& n : lp->nodes)
    if (n.kind == LoweredNode::Kind::kTransfer) {
      EXPECT_EQ(n.link, LinkClass::kDcn);
    }
  // Same island, different slice object with the same devices: no transfer at all.
  ProgramIr ir2{"y", {{DType::kF32, Shape({2})}},
                {{"p", Pmap(a, s0), {{ValueRef::kArgNode, 0}}}, {"q", Pmap(a, s2), {{0, 0}}}},
                {{1, 0}}};
  auto lp2 = Lower(ir2, {ArgOn(s0)}, ctx);
  ASSERT_TRUE(lp2.ok()) << lp2.status();
  if (s2.devices == s0.devices) {
    EXPECT_EQ(lp2->num_transfers(), 0);
  }
  // Resharding on the same devices (replicated input) is an ICI transfer.
  Binding rep = Pmap(a, s0);
  rep.in_global = {{DType::kF32, Shape({1})}};
  rep.in_sharding = {Sharding::Replicated({2}, 1)};
  ProgramIr ir3{"z", {{DType::kF32, Shape({2})}},
                {{"p", Pmap(ctx.Add(Scalar("c", "mul_scalar", 1)), s0), {{ValueRef::kArgNode, 0}}}},
                {{0, 0}}};
  auto lp3 = Lower(ir3, {ArgOn(s0)}, ctx);
  ASSERT_TRUE(lp3.ok());
  EXPECT_EQ(lp3->num_transfers(), 0);
}

TEST(LoweringTest, ErrorsNameTheNode) {
  TestContext ctx;
  auto s = ctx.Slice(2);
  FunctionId a = ctx.Add(Scalar("a", "mul_scalar", 2));
  NativeFunctionBuilder wide("wide");
  int x = wide.Input({DType::kF32, Shape({3})});
  FunctionId w = ctx.Add(wide.Build({wide.Op("neg", {x})}));
  auto lower = [&](ProgramIr ir) { return Lower(ir, {ArgOn(s)}, ctx).status(); };
  ArraySpec g2{DType::kF32, Shape({2})};

  // Shape mismatch between nodes.
  Binding bw{w, s.id, {{DType::kF32, Shape({6})}}, {Sharding::Split({2}, 1, 0)},
             {{DType::kF32, Shape({6})}}, {Sharding::Split({2}, 1, 0)}};
  auto st = lower({"p", {g2}, {{"A", Pmap(a, s), {{-1, 0}}}, {"W", bw, {{0, 0}}}}, {{1, 0}}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("node 'W' input 0 expects f32[6], but node 'A' output 0 is f32[2]"),
            std::string::npos) << st;

  // Cycle.
  st = lower({"p", {g2}, {{"A", Pmap(a, s), {{1, 0}}}, {"B", Pmap(a, s), {{0, 0}}}}, {{1, 0}}});
  EXPECT_NE(st.message().find("cycle"), std::string::npos) << st;
  EXPECT_NE(st.message().find("'A'"), std::string::npos);

  // Dangling node reference, bad output reference, unknown function, unknown slice.
  EXPECT_NE(lower({"p", {g2}, {{"A", Pmap(a, s), {{7, 0}}}}, {{0, 0}}}).message().find("node 'A' input 0"),
            std::string::npos);
  EXPECT_FALSE(lower({"p", {g2}, {{"A", Pmap(a, s), {{-1, 0}}}}, {{0, 3}}}).ok());
  st = lower({"p", {g2}, {{"A", Pmap(FunctionId(99), s), {{-1, 0}}}}, {{0, 0}}});
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("node 'A'"), std::string::npos);
  Binding ghost = Pmap(a, s);
  ghost.slice = SliceId(42);
  st = lower({"p", {g2}, {{"G", ghost, {{-1, 0}}}}, {{0, 0}}});
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("node 'G'"), std::string::npos);

  // Sharding that does not match the slice, wrong arity, argument mismatch.
  Binding bad = Pmap(a, s);
  bad.in_sharding = {Sharding::Split({4}, 1, 0)};
  bad.in_global = {{DType::kF32, Shape({4})}};
  EXPECT_FALSE(lower({"p", {g2}, {{"S", bad, {{-1, 0}}}}, {{0, 0}}}).ok());
  EXPECT_FALSE(lower({"p", {g2}, {{"A", Pmap(a, s), {}}}, {{0, 0}}}).ok());
  EXPECT_FALSE(Lower({"p", {{DType::kF32, Shape({3})}}, {{"A", Pmap(a, s), {{-1, 0}}}}, {{0, 0}}},
                     {ArgOn(s)}, ctx).ok());

  // Released slice.
  ASSERT_TRUE(ctx.rm_.ReleaseSlice(ctx.client_, s.id).ok());
  st = lower({"p", {g2}, {{"A", Pmap(a, s), {{-1, 0}}}}, {{0, 0}}});
  EXPECT_NE(st.message().find("or released"), std::string::npos) << st;
}

}  // namespace
}  // namespace pw
