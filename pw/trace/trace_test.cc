#include "pw/trace/trace.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pw/trace/trace_json.h"

namespace pw::trace {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Session {
  Session() : since(Recorder::Get().Start()) {}
  ~Session() { Recorder::Get().Stop(); }
  std::vector<Event> events() const { return Recorder::Get().Collect(since); }
  int64_t since;
};

TEST(TraceTest, SpansAreRecordedOnlyWhileATraceIsOn) {
  { Span off(DeviceTrack(DeviceId(1), HostId(0)), "compute", "f"); EXPECT_FALSE(off.active()); }
  Session s;
  {
    Span on(DeviceTrack(DeviceId(1), HostId(0)), "compute", "f", /*client=*/3);
    on.Arg("run", 7).Arg("program", "p");
    EXPECT_TRUE(on.active());
  }
  std::vector<Event> e = s.events();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].phase, 'X');
  EXPECT_EQ(e[0].name, "f");
  EXPECT_EQ(e[0].client, 3);
  EXPECT_EQ(e[0].track, DeviceTrack(DeviceId(1), HostId(0)));
  EXPECT_GE(e[0].dur_ns, 0);
  ASSERT_EQ(e[0].args.size(), 2u);
  EXPECT_EQ(std::get<int64_t>(e[0].args[0].second), 7);
  EXPECT_EQ(std::get<std::string>(e[0].args[1].second), "p");
}

TEST(TraceTest, FlowsLieInsideTheirSpans) {
  Session s;
  {
    Span a(HostTrack(HostId(0)), "dispatch", "a");
    a.FlowIn(5).FlowOut(6);
  }
  std::vector<Event> e = s.events();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].phase, 'f');
  EXPECT_EQ(e[0].flow, 5u);
  EXPECT_EQ(e[1].phase, 's');
  EXPECT_EQ(e[1].flow, 6u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(e[i].ts_ns, e[2].ts_ns);
    EXPECT_LE(e[i].ts_ns, e[2].ts_ns + e[2].dur_ns);
  }
}

TEST(TraceTest, TheLastSessionsEndClearsTheEventsAndAFullBufferCountsDrops) {
  Recorder r(/*capacity=*/2);
  const int64_t a = r.Start();
  r.Start();
  for (int i = 0; i < 3; ++i) r.Record(Event{.name = std::to_string(i), .ts_ns = Now()});
  EXPECT_EQ(r.dropped(), 1);
  r.Stop();
  EXPECT_EQ(r.Collect(a).size(), 2u);  // Another session still runs.
  r.Stop();
  EXPECT_FALSE(r.enabled());
  EXPECT_TRUE(r.Collect(a).empty());
  EXPECT_EQ(r.dropped(), 0);
}

TEST(TraceTest, ASessionCollectsFromItsStartOn) {
  Recorder r;
  r.Start();
  r.Record(Event{.name = "before", .ts_ns = Now()});
  const int64_t b = r.Start();
  r.Record(Event{.name = "after", .ts_ns = Now()});
  std::vector<Event> e = r.Collect(b);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].name, "after");
  r.Stop();
  r.Stop();
}

TEST(TraceTest, FlowIdsAreTheSameEverywhereAndDistinct) {
  EXPECT_EQ(FlowId(3, Stage::kDispatch, 1), FlowId(3, Stage::kDispatch, 1));
  EXPECT_NE(FlowId(3, Stage::kDispatch, 1), FlowId(3, Stage::kDispatch, 2));
  EXPECT_NE(FlowId(3, Stage::kDispatch, 1), FlowId(3, Stage::kCompute, 1));
  EXPECT_NE(FlowId(0, Stage::kCall), 0u);
  EXPECT_LT(FlowId(99, Stage::kCompute, 5, 6), uint64_t{1} << 53);
}

TEST(TraceTest, TheClockOffsetComesFromTheShortestRoundTrip) {
  ClockOffset c;
  EXPECT_EQ(c.offset(), 0);
  EXPECT_EQ(c.round_trip(), -1);
  c.Sample(/*t0=*/0, /*remote=*/1000, /*t1=*/100);  // offset 950, rtt 100
  c.Sample(200, 1230, 220);                         // offset 1020, rtt 20
  c.Sample(300, 5000, 900);                         // A slow one: rtt 600.
  EXPECT_EQ(c.offset(), 1020);
  EXPECT_EQ(c.round_trip(), 20);
  for (int i = 0; i < ClockOffset::kWindow; ++i) c.Sample(1000, 2000, 1040);  // rtt 40
  EXPECT_EQ(c.offset(), 980);  // The old best aged out.
}

TEST(TraceTest, ChromeJsonNamesTracksAndCarriesFlowsAndTenants) {
  Chunk c;
  c.events.push_back({.phase = 'X', .track = ClientTrack(ClientId(2)), .name = "submit",
                      .category = "submit", .ts_ns = 1000, .dur_ns = 500, .client = 2,
                      .args = {{"tenant", std::string("alice")}}});
  c.events.push_back({.phase = 's', .track = ClientTrack(ClientId(2)), .name = "run",
                      .category = "flow", .ts_ns = 1400, .flow = 42, .client = 2});
  c.events.push_back({.phase = 'X', .track = DeviceTrack(DeviceId(3), HostId(1)), .name = "f",
                      .category = "compute", .ts_ns = 2000, .dur_ns = 1000, .client = 2});
  c.events.push_back({.phase = 'f', .track = DeviceTrack(DeviceId(3), HostId(1)), .name = "run",
                      .category = "flow", .ts_ns = 2000, .flow = 42, .client = 2});
  auto j = nlohmann::json::parse(ToChromeJson(c));
  std::map<std::string, std::string> names;  // "pid/tid" -> thread name
  std::vector<nlohmann::json> spans, flows;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name")
      names[absl::StrCat(e["pid"].get<int>(), "/", e["tid"].get<int>())] = e["args"]["name"];
    if (e["ph"] == "X") spans.push_back(e);
    if (e["ph"] == "s" || e["ph"] == "f") flows.push_back(e);
  }
  EXPECT_THAT(names, ElementsAre(std::pair<const std::string, std::string>("11/1003", "device 3"),
                                 std::pair<const std::string, std::string>(
                                     "2/3", "client 2 (alice)")));
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[1]["args"]["tenant"], "alice");  // Named on every span of the tenant.
  EXPECT_DOUBLE_EQ(spans[1]["ts"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(spans[1]["dur"].get<double>(), 1.0);
  ASSERT_EQ(flows.size(), 2u);
  EXPECT_EQ(flows[0]["id"], "0x2a");
  EXPECT_EQ(flows[1]["id"], "0x2a");
  EXPECT_EQ(flows[1]["bp"], "e");
}

TEST(TraceTest, AnotherTenantsSpansAreAnonymous) {
  Chunk c;
  c.events.push_back({.phase = 'X', .name = "secret_step", .category = "compute", .client = 1,
                      .args = {{"program", std::string("secret")}}});
  c.events.push_back({.phase = 'X', .name = "mine", .category = "compute", .client = 2});
  Anonymize(c, /*viewer=*/2);
  EXPECT_EQ(c.events[0].name, "another tenant's compute");
  EXPECT_TRUE(c.events[0].args.empty());
  EXPECT_EQ(c.events[1].name, "mine");
  EXPECT_THAT(ToChromeJson(c), ::testing::Not(HasSubstr("secret")));
}

}  // namespace
}  // namespace pw::trace
