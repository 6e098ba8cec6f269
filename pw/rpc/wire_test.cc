#include "pw/rpc/wire.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw::rpc {
namespace {

const ArraySpec kF32x4{DType::kF32, Shape({4})};

// ToProto then FromProto; a failure is reported and yields a default T.
template <typename P, typename T>
T RoundTrip(const T& value) {
  P p;
  ToProto(value, &p);
  auto back = FromProto(p);
  EXPECT_TRUE(back.ok()) << back.status();
  return back.ok() ? *std::move(back) : T{};
}

// Expects an InvalidArgument whose message contains `text`.
void ExpectInvalid(const absl::Status& s, const std::string& text) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(text), absl::string_view::npos) << s;
}

TEST(WireTest, ArraySpecAndShardingRoundTrip) {
  const ArraySpec spec{DType::kBF16, Shape({2, 0, 3})};
  EXPECT_EQ(RoundTrip<v1::ArraySpec>(spec), spec);
  const ArraySpec scalar{DType::kPred, Shape()};
  EXPECT_EQ(RoundTrip<v1::ArraySpec>(scalar), scalar);
  const ArraySpec complex{DType::kC64, Shape({3})};  // The last dtype (kLast) is accepted.
  EXPECT_EQ(RoundTrip<v1::ArraySpec>(complex), complex);
  const Sharding sharding({2, 2}, {1, -1});
  EXPECT_EQ(RoundTrip<v1::Sharding>(sharding), sharding);
  EXPECT_EQ(RoundTrip<v1::Sharding>(Sharding()), Sharding());
}

TEST(WireTest, HostArrayRoundTripMovesBytes) {
  auto a = HostArray::Of(DType::kS32, Shape({3}), std::vector<int32_t>{1, -2, 3});
  ASSERT_TRUE(a.ok());
  v1::HostArray p;
  ToProto(*a, &p);
  auto back = FromProto(&p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->spec, a->spec);
  EXPECT_EQ(back->bytes, a->bytes);
  EXPECT_TRUE(p.data().empty());
}

TEST(WireTest, FunctionDefRoundTrip) {
  const NativeFunctionDef native{"scale", {kF32x4}, {{"mul_scalar", {0}, {{"value", 2.5}}}}, {1}};
  const auto n = std::get<NativeFunctionDef>(RoundTrip<v1::FunctionDef>(FunctionDef(native)));
  EXPECT_EQ(n.name, "scale");
  EXPECT_EQ(n.inputs, native.inputs);
  ASSERT_EQ(n.ops.size(), 1u);
  EXPECT_EQ(n.ops[0].kernel, "mul_scalar");
  EXPECT_EQ(n.ops[0].operands, native.ops[0].operands);
  EXPECT_EQ(n.ops[0].attrs, native.ops[0].attrs);
  EXPECT_EQ(n.outputs, native.outputs);

  const StableHloFunctionDef hlo{"g", std::string("ml\0ir", 5), {kF32x4}, {kF32x4, kF32x4}, 4};
  const auto s = std::get<StableHloFunctionDef>(RoundTrip<v1::FunctionDef>(FunctionDef(hlo)));
  EXPECT_EQ(s.name, hlo.name);
  EXPECT_EQ(s.module, hlo.module);
  EXPECT_EQ(s.inputs, hlo.inputs);
  EXPECT_EQ(s.outputs, hlo.outputs);
  EXPECT_EQ(s.num_partitions, 4);
}

TEST(WireTest, ProgramIrRoundTrip) {
  const Sharding split = Sharding::Split({2}, 1, 0);
  ProgramIr ir{"prog", {kF32x4}, {}, {ValueRef{1, 0}}};
  ir.nodes.push_back({"a", {FunctionId(1), SliceId(2), {kF32x4}, {split}, {kF32x4}, {split}},
                      {ValueRef{ValueRef::kArgNode, 0}}});
  ir.nodes.push_back({"b", {FunctionId(3), SliceId(2), {kF32x4}, {split}, {}, {}}, {{0, 0}}});
  const ProgramIr back = RoundTrip<v1::ProgramIr>(ir);
  EXPECT_EQ(back.name, ir.name);
  EXPECT_EQ(back.args, ir.args);
  EXPECT_EQ(back.outputs, ir.outputs);
  ASSERT_EQ(back.nodes.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ProgramNode &x = back.nodes[i], &y = ir.nodes[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.binding.function, y.binding.function);
    EXPECT_EQ(x.binding.slice, y.binding.slice);
    EXPECT_EQ(x.binding.in_global, y.binding.in_global);
    EXPECT_EQ(x.binding.in_sharding, y.binding.in_sharding);
    EXPECT_EQ(x.binding.out_global, y.binding.out_global);
    EXPECT_EQ(x.binding.out_sharding, y.binding.out_sharding);
  }
}

TEST(WireTest, SliceRequestPlacementRoundTripsAndUnknownOnesAreRefused) {
  for (SlicePlacement p : {SlicePlacement::kIsland, SlicePlacement::kHost, SlicePlacement::kSpread})
    EXPECT_EQ(RoundTrip<v1::SliceRequest>(SliceRequest{2, {2}, p}).placement, p);
  v1::SliceRequest r;
  r.set_num_devices(1);
  r.set_placement(static_cast<v1::SliceRequest::Placement>(9));
  ExpectInvalid(FromProto(r).status(), "slice request placement");
  const SliceRequest where = RoundTrip<v1::SliceRequest>(
      SliceRequest{.num_devices = 2, .islands = {IslandId(1)}, .hosts = {HostId(2), HostId(3)},
                   .avoid_islands = {IslandId(0)}});
  EXPECT_EQ(where.islands, std::vector<IslandId>{IslandId(1)});
  EXPECT_EQ(where.hosts, (std::vector<HostId>{HostId(2), HostId(3)}));
  EXPECT_EQ(where.avoid_islands, std::vector<IslandId>{IslandId(0)});
  r.set_placement(v1::SliceRequest::ISLAND);
  r.add_hosts(-1);
  ExpectInvalid(FromProto(r).status(), "slice request hosts[0]");
}

TEST(WireTest, SliceInfoRoundTrip) {
  const SliceInfo s{SliceId(7), ClientId(1), {DeviceId(4), DeviceId(5)}, {2}, {IslandId(0)},
                    {HostId(2), HostId(3)}};
  const SliceInfo back = RoundTrip<v1::SliceInfo>(s);
  EXPECT_EQ(back.id, s.id);
  EXPECT_EQ(back.owner, s.owner);
  EXPECT_EQ(back.devices, s.devices);
  EXPECT_EQ(back.mesh_shape, s.mesh_shape);
  EXPECT_EQ(back.islands, s.islands);
  EXPECT_EQ(back.hosts, s.hosts);
}

TEST(WireTest, HostProgramRoundTrip) {
  HostProgram h;
  h.program = "prog";
  auto devices = std::make_shared<const std::vector<DeviceId>>(std::vector{DeviceId(4), DeviceId(5)});
  h.nodes.push_back({0, "compute", ComputeWork{FunctionId(3), devices, {1},
                                               {0}, {1}}});
  h.nodes.push_back(
      {1, "transfer",
       TransferWork{1, 2, kF32x4, Sharding::Split({2}, 1, 0), {DeviceId(4), DeviceId(5)},
                    {HostId(0), HostId(1)}, Sharding::Replicated({2}, 1),
                    {DeviceId(6), DeviceId(7)}, {0, 1}, LinkClass::kDcn}});
  const HostProgram back = RoundTrip<v1::HostProgram>(h);
  EXPECT_EQ(back.program, "prog");
  ASSERT_EQ(back.nodes.size(), 2u);
  EXPECT_EQ(back.nodes[0].node, 0);
  EXPECT_EQ(back.nodes[0].name, "compute");
  const auto& c = std::get<ComputeWork>(back.nodes[0].work);
  const auto& c0 = std::get<ComputeWork>(h.nodes[0].work);
  EXPECT_EQ(c.function, c0.function);
  EXPECT_EQ(*c.slice_devices, *c0.slice_devices);
  EXPECT_EQ(c.local_ranks, c0.local_ranks);
  EXPECT_EQ(c.inputs, c0.inputs);
  EXPECT_EQ(c.outputs, c0.outputs);
  EXPECT_EQ(back.nodes[1].name, "transfer");
  const auto& t = std::get<TransferWork>(back.nodes[1].work);
  const auto& t0 = std::get<TransferWork>(h.nodes[1].work);
  EXPECT_EQ(t.src, t0.src);
  EXPECT_EQ(t.dst, t0.dst);
  EXPECT_EQ(t.global, t0.global);
  EXPECT_EQ(t.src_sharding, t0.src_sharding);
  EXPECT_EQ(t.src_devices, t0.src_devices);
  EXPECT_EQ(t.src_hosts, t0.src_hosts);
  EXPECT_EQ(t.dst_sharding, t0.dst_sharding);
  EXPECT_EQ(t.dst_devices, t0.dst_devices);
  EXPECT_EQ(t.local_ranks, t0.local_ranks);
  EXPECT_EQ(t.link, LinkClass::kDcn);
}

// Issue 24: nodes on one slice name its devices once on the wire (and share them after); a
// node naming a slice the program does not have is refused, naming the field.
TEST(WireTest, HostProgramNamesEachSliceOnce) {
  HostProgram h;
  auto slice = std::make_shared<const std::vector<DeviceId>>(std::vector{DeviceId(0), DeviceId(1)});
  for (int n = 0; n < 3; ++n) h.nodes.push_back({n, "c", ComputeWork{FunctionId(1), slice, {0}}});
  v1::HostProgram p;
  ToProto(h, &p);
  EXPECT_EQ(p.slices_size(), 1);
  const HostProgram back = *FromProto(p);
  EXPECT_EQ(std::get<ComputeWork>(back.nodes[0].work).slice_devices,
            std::get<ComputeWork>(back.nodes[2].work).slice_devices);
  p.mutable_nodes(1)->mutable_compute()->set_slice(5);
  absl::StatusOr<HostProgram> bad = FromProto(p);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("HostProgram node 1: compute: slice is 5, not in [0, 1)"));
}

TEST(WireTest, HostAndClusterStatusRoundTrip) {
  HostStatus h{HostId(2), IslandId(1), {}, 5, 640, 100, 200, 3};
  h.devices.push_back({DeviceId(4), HostId(2), IslandId(1), false, 1 << 20, 512, 1, 2, 9});
  h.cancelled_shards = 7;
  h.functions = 11;
  h.executables = 12;
  h.programs = 13;
  h.ici_wire_bytes_received = 30;
  h.dcn_wire_bytes_received = 40;
  h.plans = 14;
  const HostStatus back = RoundTrip<v1::HostStatus>(h);
  EXPECT_EQ(back.cancelled_shards, 7u);
  EXPECT_EQ(back.functions, 11u);
  EXPECT_EQ(back.executables, 12u);
  EXPECT_EQ(back.programs, 13u);
  EXPECT_EQ(back.plans, 14u);
  EXPECT_EQ(back.host, h.host);
  EXPECT_EQ(back.island, h.island);
  EXPECT_EQ(back.buffers, 5u);
  EXPECT_EQ(back.buffer_bytes, 640);
  EXPECT_EQ(back.ici_bytes_received, 100);
  EXPECT_EQ(back.dcn_bytes_received, 200);
  EXPECT_EQ(back.ici_wire_bytes_received, 30);
  EXPECT_EQ(back.dcn_wire_bytes_received, 40);
  EXPECT_EQ(back.dispatch_queue_depth, 3u);
  ASSERT_EQ(back.devices.size(), 1u);
  const DeviceStatus& d = back.devices[0];
  EXPECT_EQ(d.id, DeviceId(4));
  EXPECT_EQ(d.host, HostId(2));
  EXPECT_EQ(d.island, IslandId(1));
  EXPECT_FALSE(d.alive);
  EXPECT_EQ(d.memory_capacity, 1 << 20);
  EXPECT_EQ(d.memory_in_use, 512);
  EXPECT_EQ(d.memory_waiters, 1u);
  EXPECT_EQ(d.queue_depth, 2u);
  EXPECT_EQ(d.executed, 9);

  v1::ClusterStatus p;
  p.set_clients(4);  // Not part of pw::ClusterStatus: left as it is.
  ToProto(ClusterStatus{{h}, 6, 1, 10, {0, 2}, {0, 1'500'000}}, &p);
  EXPECT_EQ(p.clients(), 4);
  auto c = FromProto(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hosts.size(), 1u);
  EXPECT_EQ(c->logical_buffers, 6u);
  EXPECT_EQ(c->runs_in_flight, 1u);
  EXPECT_EQ(c->runs_completed, 10);
  EXPECT_EQ(c->scheduler_queue_depth, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(c->scheduler_round_trip_ns, (std::vector<int64_t>{0, 1'500'000}));
  p.set_scheduler_round_trip_ns(1, -1);
  ExpectInvalid(FromProto(p).status(), "scheduler_round_trip_ns[1]");
}

TEST(WireTest, RejectsMalformedMessages) {
  v1::ArraySpec spec;
  spec.set_dtype(99);
  ExpectInvalid(FromProto(spec).status(), "dtype");
  spec.set_dtype(static_cast<int>(DType::kF32));
  spec.add_dims(-1);
  ExpectInvalid(FromProto(spec).status(), "negative");
  v1::ArraySpec deep;  // Issue 20, item 1: rank 60,001 crashed the controller's copy.
  deep.set_dtype(static_cast<int>(DType::kF64));
  deep.add_dims(2);
  for (int i = 0; i < 60000; ++i) deep.add_dims(1);
  ExpectInvalid(FromProto(deep).status(), "shape of rank 60001 exceeds the limit of 64");

  v1::HostArray a;
  ToProto(kF32x4, a.mutable_spec());
  a.set_data(std::string(15, 'x'));
  ExpectInvalid(FromProto(&a).status(), "host array data");

  v1::Sharding s;
  s.add_mesh_shape(2);
  s.add_dim_to_axis(1);
  ExpectInvalid(FromProto(s).status(), "dim_to_axis");

  ExpectInvalid(FromProto(v1::FunctionDef()).status(), "kind");
  ExpectInvalid(DispatchModeFromProto(7).status(), "dispatch mode");
  EXPECT_EQ(*DispatchModeFromProto(1), DispatchMode::kSequential);

  // A session's submit: options round-trip; a negative timeout or unknown mode is refused.
  RunOptions o(DispatchMode::kSequential);
  o.timeout = absl::Milliseconds(3);
  o.trace_flow = 9;
  o.outputs = {BufferId(4), BufferId(4), BufferId(7)};
  v1::SubmitRequest submit;
  ToProto(o, &submit);
  absl::StatusOr<RunOptions> back = RunOptionsFromProto(submit);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->mode, DispatchMode::kSequential);
  EXPECT_EQ(back->timeout, absl::Milliseconds(3));
  EXPECT_EQ(back->trace_flow, 9u);
  EXPECT_EQ(back->outputs, o.outputs);
  submit.set_timeout_us(-1);
  ExpectInvalid(RunOptionsFromProto(submit).status(), "timeout_us");
  submit.set_timeout_us(0);
  submit.set_mode(5);
  ExpectInvalid(RunOptionsFromProto(submit).status(), "dispatch mode");

  v1::ProgramIr ir;
  ir.add_nodes()->mutable_binding()->add_in_sharding()->add_mesh_shape(0);
  ExpectInvalid(FromProto(ir).status(), "ProgramIr node 0: binding in_sharding 0: mesh_shape");

  // Issue 20: a mesh of 10^6 axes of 1 was accepted and stored.
  v1::SliceRequest wide;
  wide.set_num_devices(1);
  for (int i = 0; i < 1000000; ++i) wide.add_mesh_shape(1);
  ExpectInvalid(FromProto(wide).status(), "has 1000000 axes, above the limit of 64");
}

TEST(WireTest, StatusRoundTrip) {
  const absl::Status s = absl::NotFoundError("x");
  EXPECT_EQ(FromGrpc(ToGrpc(s)), s);
  EXPECT_TRUE(FromGrpc(ToGrpc(absl::OkStatus())).ok());
  v1::StatusProto p;
  ToProto(s, &p);
  EXPECT_EQ(FromProto(p), s);
}

TEST(WireTest, LongErrorsKeepTheirHeadAndTailOverGrpc) {
  const std::string head = "run:7 program 'long' node 'step#3': ";
  const std::string tail = "device:6 was removed: host:3 failed";
  const absl::Status long_error =
      absl::UnavailableError(head + std::string(20000, 'x') + tail);
  const grpc::Status g = ToGrpc(long_error);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LE(g.error_message().size(), kMaxGrpcMessageBytes);
  EXPECT_EQ(g.error_message().substr(0, head.size()), head);
  EXPECT_EQ(g.error_message().substr(g.error_message().size() - tail.size()), tail);
  EXPECT_NE(g.error_message().find("bytes of this error left out"), std::string::npos);
  // Short ones pass whole.
  EXPECT_EQ(FromGrpc(ToGrpc(absl::NotFoundError("buffer:3"))), absl::NotFoundError("buffer:3"));
}

}  // namespace
}  // namespace pw::rpc
