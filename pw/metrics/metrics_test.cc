#include "pw/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace pw::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Text(const Families& families) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

HostStatus SomeHost() {
  HostStatus h;
  h.host = HostId(3);
  h.island = IslandId(1);
  h.buffers = 5;
  h.buffer_bytes = 640;
  h.ici_bytes_received = 100;
  h.dcn_bytes_received = 200;
  h.ici_wire_bytes_received = 30;
  h.dcn_wire_bytes_received = 40;
  h.dispatch_queue_depth = 2;
  h.functions = 4;
  DeviceStatus d;
  d.id = DeviceId(6);
  d.memory_capacity = 1 << 20;
  d.memory_in_use = 4096;
  d.memory_waiters = 1;
  d.queue_depth = 3;
  d.executed = 42;
  h.devices = {d};
  return h;
}

TEST(MetricsTest, AHostsStatusReadsAsLabelledGaugesAndCounters) {
  const std::string text = Text(HostFamilies(SomeHost()));
  EXPECT_THAT(text, HasSubstr("# TYPE pw_host_buffers gauge"));
  EXPECT_THAT(text, HasSubstr("pw_host_buffers{host=\"3\",island=\"1\"} 5"));
  EXPECT_THAT(text, HasSubstr("# TYPE pw_host_received_bytes_total counter"));
  EXPECT_THAT(text, HasSubstr("pw_host_received_bytes_total{host=\"3\",island=\"1\",link=\"ici\"} 100"));
  EXPECT_THAT(text, HasSubstr("pw_host_received_bytes_total{host=\"3\",island=\"1\",link=\"dcn\"} 200"));
  EXPECT_THAT(text, HasSubstr("pw_host_wire_bytes_total{host=\"3\",island=\"1\",link=\"ici\"} 30"));
  EXPECT_THAT(text, HasSubstr("pw_host_wire_bytes_total{host=\"3\",island=\"1\",link=\"dcn\"} 40"));
  EXPECT_THAT(text, HasSubstr("pw_device_computations_total{host=\"3\",island=\"1\",device=\"6\"} 42"));
  EXPECT_THAT(text, HasSubstr("pw_device_memory_in_use_bytes{host=\"3\",island=\"1\",device=\"6\"} 4096"));
  EXPECT_THAT(text, HasSubstr("pw_device_memory_waiters{host=\"3\",island=\"1\",device=\"6\"} 1"));
  EXPECT_THAT(text, HasSubstr("pw_device_up{host=\"3\",island=\"1\",device=\"6\"} 1"));
  HostStatus unreachable = SomeHost();
  unreachable.error = "unavailable";
  EXPECT_TRUE(HostFamilies(unreachable).empty());
}

TEST(MetricsTest, TheClustersStatusAndItsRuns) {
  ClusterStatus c;
  c.runs_in_flight = 2;
  c.runs_completed = 9;
  c.logical_buffers = 7;
  c.scheduler_queue_depth = {0, 3};
  c.scheduler_round_trip_ns = {0, 1'500'000};
  const std::string text = Text(ClusterFamilies(c, 4));
  EXPECT_THAT(text, HasSubstr("pw_clients 4"));
  EXPECT_THAT(text, HasSubstr("pw_runs_completed_total 9"));
  EXPECT_THAT(text, HasSubstr("pw_scheduler_queue_depth{island=\"1\"} 3"));
  EXPECT_THAT(text, HasSubstr("pw_scheduler_round_trip_seconds{island=\"1\"} 0.0015"));
  RunMetrics runs;
  runs.Observe(absl::Milliseconds(3), absl::OkStatus());
  runs.Observe(absl::Milliseconds(30), absl::OkStatus());
  runs.Observe(absl::Seconds(2), absl::DeadlineExceededError("late"));
  const std::string r = Text(runs.registry()->Collect());
  EXPECT_THAT(r, HasSubstr("pw_runs_total{code=\"OK\"} 2"));
  EXPECT_THAT(Text(RunMetrics().registry()->Collect()), HasSubstr("pw_runs_total{code=\"OK\"} 0"));
  EXPECT_THAT(r, HasSubstr("pw_runs_total{code=\"DEADLINE_EXCEEDED\"} 1"));
  EXPECT_THAT(r, HasSubstr("pw_run_duration_seconds_count 3"));
  EXPECT_THAT(r, HasSubstr("pw_run_duration_seconds_bucket{le=\"0.005\"} 1"));
  EXPECT_THAT(r, HasSubstr("pw_run_duration_seconds_bucket{le=\"2.5\"} 3"));
}

// GET http://address/metrics over a plain socket.
std::string Get(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(colon + 1), &port));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

TEST(MetricsTest, TheServerAnswersEachScrapeWithWhatIsCollectedThen) {
  int scrapes = 0;
  RunMetrics runs;
  runs.Observe(absl::Milliseconds(1), absl::OkStatus());
  auto server = MetricsServer::Start(
      "127.0.0.1:0",
      [&] {
        ++scrapes;
        HostStatus h = SomeHost();
        h.buffers = scrapes;
        return HostFamilies(h);
      },
      {runs.registry()});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->address(), ::testing::StartsWith("127.0.0.1:"));
  EXPECT_THAT((*server)->address(), Not(::testing::EndsWith(":0")));
  std::string first = Get((*server)->address());
  EXPECT_THAT(first, HasSubstr("200 OK"));
  EXPECT_THAT(first, HasSubstr("pw_host_buffers{host=\"3\",island=\"1\"} 1"));
  EXPECT_THAT(first, HasSubstr("pw_runs_total{code=\"OK\"} 1"));
  EXPECT_THAT(Get((*server)->address()), HasSubstr("pw_host_buffers{host=\"3\",island=\"1\"} 2"));
  // The same port again is refused, and nonsense is not an address.
  auto taken = MetricsServer::Start((*server)->address(), [] { return Families(); });
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable) << taken.status();
  EXPECT_EQ(MetricsServer::Start("nowhere", [] { return Families(); }).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pw::metrics
