#include "pw/dashboard/dashboard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pw/embedded/embedded_cluster.h"
#include "pw/executor/native_function.h"
#include "pw/rpc/wire.h"
#include "pw/server/status_json.h"

namespace pw::dashboard {
namespace {

using ::testing::HasSubstr;

// GET http://127.0.0.1:port/path: the response's body.
std::string Get(const std::string& url, const std::string& path) {
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  EXPECT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

NativeFunctionDef Inc() {
  NativeFunctionBuilder b("inc");
  int x = b.Input({DType::kF32, Shape({})});
  return b.Build({b.Op("add_scalar", {x}, {{"value", 1.0}})});
}

TEST(DashboardTest, ServesThePageAndTheClusterWithATimelineOfEveryTenant) {
  auto cluster = *EmbeddedCluster::Create(*ClusterSpec::Uniform(2, 1, 2));
  Controller* c = &cluster->controller();
  auto admin = *Client::Connect(c, "dashboard");
  Options o;
  o.status = [c]() -> absl::StatusOr<std::string> {
    absl::StatusOr<ClusterStatus> st = c->Status();
    if (!st.ok()) return st.status();
    return server::StatusJson(*st, 0);
  };
  o.tracer = admin.get();
  o.all_tenants = true;
  o.window = absl::Milliseconds(200);
  o.period = absl::Milliseconds(250);
  auto d = Dashboard::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT((*d)->url(), ::testing::StartsWith("http://127.0.0.1:"));
  EXPECT_THAT(Get((*d)->url(), "/"), HasSubstr("<svg id=\"timeline\""));
  // Seen failing: civetweb's own 404 (what a browser's /favicon.ico got) crashed the server.
  EXPECT_EQ(Get((*d)->url(), "/favicon.ico"), "not found\n");
  EXPECT_THAT(Get((*d)->url(), "/"), HasSubstr("<svg id=\"timeline\""));  // Still serving.

  std::atomic<bool> stop{false};
  auto load = [&](const std::string& name, int island) {
    auto client = *Client::Connect(c, name);
    Slice s = *client->MakeVirtualDeviceSet().AddSlice({.num_devices = 2,
                                                        .islands = {IslandId(island)}});
    BoundFunction f = *client->Pmap(Inc(), s);
    Array x = *client->Put(*HostArray::Of<float>(DType::kF32, Shape({2}), {0, 0}), s.info().id,
                           Sharding::Split({2}, 1, 0));
    while (!stop.load()) ASSERT_TRUE(f.Call({x}).ok());
  };
  std::thread alice(load, "alice", 0), bob(load, "bob", 1);
  // Until a window holds both tenants' computations.
  nlohmann::json state;
  for (int i = 0; i < 400; ++i) {
    state = nlohmann::json::parse(Get((*d)->url(), "/api/state"));
    const auto& t = state["timeline"];
    if (!t.is_null() && t["tenants"].size() >= 2 && t["spans"].size() > 10) {
      std::set<int64_t> clients;
      for (const auto& s : t["spans"]) clients.insert(s["client"].get<int64_t>());
      if (clients.size() >= 2) break;
    }
    absl::SleepFor(absl::Milliseconds(50));  // Polls for what must happen; not a timing test.
  }
  stop = true;
  alice.join();
  bob.join();
  ASSERT_EQ(state["status"]["hosts"].size(), 2u);
  EXPECT_EQ(state["status"]["hosts"][0]["devices"].size(), 2u);
  EXPECT_TRUE(state["status"]["hosts"][0]["devices"][0].contains("busy_seconds"));
  std::set<std::string> names;
  for (const auto& [k, v] : state["timeline"]["tenants"].items()) names.insert(v);
  // Each client is its own tenant, named "<client>:<id>" by every span that names it (seen
  // failing: the controller's spans said "alice", the island scheduler's "alice:1", and which
  // came first in a window decided the label).
  const auto tenant_of = [&](const std::string& client) {
    return std::count_if(names.begin(), names.end(),
                         [&](const std::string& n) { return absl::StartsWith(n, client + ":"); });
  };
  EXPECT_EQ(tenant_of("alice"), 1) << state["timeline"]["tenants"];
  EXPECT_EQ(tenant_of("bob"), 1) << state["timeline"]["tenants"];
  EXPECT_EQ(state["timeline"]["devices"].size(), 4u);  // Alice's island and Bob's.
  EXPECT_EQ(state["error"], "");
  EXPECT_GE((*d)->windows(), 1);
}

TEST(DashboardTest, StatusHistoryGivesAnEarlierStatusAtLeastTheGapBefore) {
  StatusHistory h(/*min_gap_ms=*/500, /*max_age_ms=*/30000);
  EXPECT_EQ(h.Add("1", 1000), "null");  // Nothing earlier yet.
  EXPECT_EQ(h.Add("2", 1400), "null");  // Within the gap of the first.
  auto p = nlohmann::json::parse(h.Add("3", 1600));
  EXPECT_EQ(p["status"], 1);  // The first of its period, not the one 200 ms before.
  EXPECT_EQ(p["at_ms"], 1000);
  EXPECT_EQ(nlohmann::json::parse(h.Add("4", 1700))["status"], 1);
  EXPECT_EQ(nlohmann::json::parse(h.Add("5", 2200))["status"], 3);
  EXPECT_EQ(h.Add("6", 100000), "null");  // The earlier one is too old for a rate.
  EXPECT_EQ(nlohmann::json::parse(h.Add("7", 100600))["status"], 6);
}

TEST(DashboardTest, TheTimelineKeepsTheLatestSpansOfTheWindow) {
  trace::Chunk c;
  for (int i = 0; i < 5; ++i)
    c.events.push_back({.phase = 'X', .track = trace::DeviceTrack(DeviceId(i % 2), HostId(0)),
                        .name = "f", .category = "compute", .ts_ns = 1000000 * (i + 1),
                        .dur_ns = 500000, .client = i % 2});
  c.events.push_back({.phase = 'X', .track = trace::ControllerTrack(ClientId(1)),
                      .name = "submit", .category = "submit", .client = 1,
                      .args = {{"tenant", std::string("bob")}}});
  auto j = nlohmann::json::parse(TimelineJson(c, 0, 10000000, /*max_spans=*/3));
  EXPECT_DOUBLE_EQ(j["window_ms"].get<double>(), 10.0);
  ASSERT_EQ(j["spans"].size(), 3u);
  EXPECT_DOUBLE_EQ(j["spans"][0]["start_ms"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j["spans"][0]["dur_ms"].get<double>(), 0.5);
  EXPECT_EQ(j["tenants"]["1"], "bob");
  EXPECT_EQ(j["tenants"]["0"], "client 0");  // Anonymous still gets a label.
  EXPECT_EQ(j["devices"], nlohmann::json({0, 1}));
}

}  // namespace
}  // namespace pw::dashboard
