#include "pw/metrics/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace pw::metrics {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// Families by name, in the order first added.
class Builder {
 public:
  void Add(const std::string& name, const std::string& help, MetricType type, Labels labels,
           double value) {
    MetricFamily* f = nullptr;
    for (MetricFamily& g : families_)
      if (g.name == name) f = &g;
    if (f == nullptr) {
      families_.push_back({name, help, type, {}});
      f = &families_.back();
    }
    ClientMetric m;
    m.label = std::move(labels);
    if (type == MetricType::Counter) m.counter.value = value;
    else m.gauge.value = value;
    f->metric.push_back(std::move(m));
  }
  Families Take() { return std::move(families_); }

 private:
  Families families_;
};

constexpr auto kGauge = MetricType::Gauge;
constexpr auto kCounter = MetricType::Counter;

// A Collectable of a function's families.
class Collected final : public prometheus::Collectable {
 public:
  explicit Collected(std::function<Families()> f) : f_(std::move(f)) {}
  Families Collect() const override { return f_(); }

 private:
  std::function<Families()> f_;
};

}  // namespace

Families HostFamilies(const HostStatus& s) {
  Builder b;
  if (!s.error.empty()) return b.Take();
  const Labels host{{"host", absl::StrCat(s.host.value())}, {"island", absl::StrCat(s.island.value())}};
  b.Add("pw_host_buffers", "Buffers (shards) held in the host's object store.", kGauge, host,
        static_cast<double>(s.buffers));
  b.Add("pw_host_buffer_bytes", "Bytes of the buffers held in the host's object store.", kGauge,
        host, static_cast<double>(s.buffer_bytes));
  Labels ici = host, dcn = host;
  ici.push_back({"link", "ici"});
  dcn.push_back({"link", "dcn"});
  b.Add("pw_host_received_bytes_total",
        "Bytes of transfers and collectives received, by link class (ICI inside an island, DCN "
        "between islands).", kCounter, ici, static_cast<double>(s.ici_bytes_received));
  b.Add("pw_host_received_bytes_total", "", kCounter, dcn, static_cast<double>(s.dcn_bytes_received));
  b.Add("pw_host_wire_bytes_total",
        "Of the bytes received, those that crossed from another process (whole source shards "
        "of transfers, collective inputs), by link class.",
        kCounter, ici, static_cast<double>(s.ici_wire_bytes_received));
  b.Add("pw_host_wire_bytes_total", "", kCounter, dcn,
        static_cast<double>(s.dcn_wire_bytes_received));
  Labels save = host, load = host;
  save.push_back({"op", "save"});
  load.push_back({"op", "load"});
  b.Add("pw_host_checkpoint_bytes_total",
        "Bytes of the shards the host wrote to checkpoints (save) and read from them (load).",
        kCounter, save, static_cast<double>(s.checkpoint_bytes_saved));
  b.Add("pw_host_checkpoint_bytes_total", "", kCounter, load,
        static_cast<double>(s.checkpoint_bytes_loaded));
  b.Add("pw_host_commands_received_total",
        "Commands a worker process read from its command stream (none in process).", kCounter,
        host, static_cast<double>(s.commands_received));
  b.Add("pw_host_command_messages_received_total",
        "The messages those commands came in (each a batch; fewer is cheaper).", kCounter, host,
        static_cast<double>(s.command_messages_received));
  b.Add("pw_host_events_sent_total",
        "Events a worker process sent back on its command stream (enqueued, done).", kCounter,
        host, static_cast<double>(s.events_sent));
  b.Add("pw_host_event_messages_sent_total", "The messages those events went in (each a batch).",
        kCounter, host, static_cast<double>(s.event_messages_sent));
  b.Add("pw_host_events_mailed_total",
        "Answers to peers' fetches sent through their shared-memory mailboxes instead.", kCounter,
        host, static_cast<double>(s.events_mailed));
  b.Add("pw_host_dispatch_queue_depth", "Host programs waiting on the host's dispatch thread.",
        kGauge, host, static_cast<double>(s.dispatch_queue_depth));
  b.Add("pw_host_cancelled_shards_total", "Shards of cancelled runs that were not run.", kCounter,
        host, static_cast<double>(s.cancelled_shards));
  b.Add("pw_host_functions", "Functions loaded on the host.", kGauge, host,
        static_cast<double>(s.functions));
  b.Add("pw_host_executables", "Compiled executables held (per function and slice shape).",
        kGauge, host, static_cast<double>(s.executables));
  b.Add("pw_host_plans", "Dispatch plans cached on the host.", kGauge, host,
        static_cast<double>(s.plans));
  b.Add("pw_host_compiles_total", "XLA compilations run on the host.", kCounter, host,
        static_cast<double>(s.compiles));
  b.Add("pw_host_compile_seconds_total", "Time the host's XLA compilations took.", kCounter, host,
        static_cast<double>(s.compile_ns) / 1e9);
  b.Add("pw_host_executable_cache_hits_total",
        "Executable lookups served from the host's cache (no compilation).", kCounter, host,
        static_cast<double>(s.executable_hits));
  b.Add("pw_host_collectives_total", "Collectives the host's shards ran.", kCounter, host,
        static_cast<double>(s.collectives));
  b.Add("pw_host_collective_seconds_total",
        "Time the host's shards spent in collectives (summed over shards).", kCounter, host,
        static_cast<double>(s.collective_ns) / 1e9);
  for (const auto& [client, ns] : s.client_device_ns) {
    Labels c = host;
    c.push_back({"client", absl::StrCat(client.value())});
    b.Add("pw_client_device_seconds_total",
          "Device time the host's devices spent on each client's work: its share achieved is "
          "its part of the sum over clients.", kCounter, c, static_cast<double>(ns) / 1e9);
  }
  for (const DeviceStatus& d : s.devices) {
    Labels dev = host;
    dev.push_back({"device", absl::StrCat(d.id.value())});
    b.Add("pw_device_up", "1 if the device is in service, 0 if it was removed.", kGauge, dev,
          d.alive ? 1 : 0);
    b.Add("pw_device_memory_in_use_bytes", "Device memory reserved by buffers and runs "
          "(pw_host_buffer_bytes of it hold stored buffers).", kGauge,
          dev, static_cast<double>(d.memory_in_use));
    b.Add("pw_device_memory_capacity_bytes", "The device's memory.", kGauge, dev,
          static_cast<double>(d.memory_capacity));
    b.Add("pw_device_memory_waiters", "Reservations waiting for device memory (back-pressure).",
          kGauge, dev, static_cast<double>(d.memory_waiters));
    b.Add("pw_device_queue_depth", "Computations queued on the device's executor.", kGauge, dev,
          static_cast<double>(d.queue_depth));
    b.Add("pw_device_computations_total", "Computations (shards of compiled functions) the "
          "device has executed.", kCounter, dev, static_cast<double>(d.executed));
    b.Add("pw_device_busy_seconds_total", "Time the device's executor spent running its queue's "
          "items (waits inside them for inputs or memory included).", kCounter, dev,
          static_cast<double>(d.busy_ns) / 1e9);
  }
  return b.Take();
}

Families ClusterFamilies(const ClusterStatus& s, size_t clients) {
  Builder b;
  b.Add("pw_clients", "Clients connected to the controller.", kGauge, {},
        static_cast<double>(clients));
  b.Add("pw_runs_in_flight", "Runs submitted and not yet finished.", kGauge, {},
        static_cast<double>(s.runs_in_flight));
  b.Add("pw_runs_completed_total", "Runs finished (any outcome).", kCounter, {},
        static_cast<double>(s.runs_completed));
  b.Add("pw_logical_buffers", "Sharded buffers the controller tracks.", kGauge, {},
        static_cast<double>(s.logical_buffers));
  for (size_t i = 0; i < s.scheduler_queue_depth.size(); ++i)
    b.Add("pw_scheduler_queue_depth", "Runs waiting in an island's gang scheduler.", kGauge,
          {{"island", absl::StrCat(i)}}, static_cast<double>(s.scheduler_queue_depth[i]));
  for (size_t i = 0; i < s.scheduler_round_trip_ns.size(); ++i)
    b.Add("pw_scheduler_round_trip_seconds",
          "The control round trip an island's gang scheduler keeps its window on top of.", kGauge,
          {{"island", absl::StrCat(i)}}, static_cast<double>(s.scheduler_round_trip_ns[i]) / 1e9);
  for (const ClusterStatus::Tenant& t : s.tenants) {
    b.Add("pw_tenant_share", "A tenant's configured share of each island's device time.", kGauge,
          {{"tenant", t.name}}, t.share);
    b.Add("pw_tenant_achieved_share",
          "A tenant's fraction of the device time of work that finished in the last second.",
          kGauge, {{"tenant", t.name}}, t.achieved_share);
    b.Add("pw_tenant_device_seconds_total",
          "Device time of a tenant's work (summed over devices) since it appeared.", kCounter,
          {{"tenant", t.name}}, t.device_seconds);
    b.Add("pw_tenant_queued", "A tenant's requests waiting in the islands' gang schedulers.",
          kGauge, {{"tenant", t.name}}, static_cast<double>(t.queued));
    b.Add("pw_tenant_memory_bytes", "Bytes of arrays a tenant's clients hold on the cluster.",
          kGauge, {{"tenant", t.name}}, static_cast<double>(t.memory_bytes));
  }
  return b.Take();
}

RunMetrics::RunMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  runs_ = &prometheus::BuildCounter()
               .Name("pw_runs_total")
               .Help("Runs finished, by outcome (a status code name; OK for success).")
               .Register(*registry_);
  ok_ = &runs_->Add({{"code", "OK"}});
  duration_ = &prometheus::BuildHistogram()
                   .Name("pw_run_duration_seconds")
                   .Help("Time from a run's submission to its completion.")
                   .Register(*registry_)
                   .Add({}, prometheus::Histogram::BucketBoundaries{
                                1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
                                0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  dispatch_ = &prometheus::BuildHistogram()
                   .Name("pw_run_dispatch_seconds")
                   .Help("A run's dispatch overhead: from its submission until it is enqueued "
                         "on every device (validated, gang-scheduled, dispatched).")
                   .Register(*registry_)
                   .Add({}, prometheus::Histogram::BucketBoundaries{
                                1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1});
}

void RunMetrics::ObserveDispatch(absl::Duration latency) {
  dispatch_->Observe(absl::ToDoubleSeconds(latency));
}

void RunMetrics::Observe(absl::Duration latency, const absl::Status& outcome) {
  if (outcome.ok()) ok_->Increment();
  else runs_->Add({{"code", std::string(absl::StatusCodeToString(outcome.code()))}}).Increment();
  duration_->Observe(absl::ToDoubleSeconds(latency));
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::function<Families()> collect,
    std::vector<std::shared_ptr<prometheus::Registry>> registries) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", listen, "' is not host:port"));
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  try {
    s->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics at ", listen, ": ", e.what()));
  }
  const std::vector<int> ports = s->exposer_->GetListeningPorts();
  if (ports.empty())
    return absl::UnavailableError(absl::StrCat("cannot serve metrics at ", listen));
  s->address_ = absl::StrCat(listen.substr(0, colon), ":", ports.front());
  s->collectables_.push_back(std::make_shared<Collected>(std::move(collect)));
  for (auto& r : registries) s->collectables_.push_back(std::move(r));
  for (const auto& c : s->collectables_) s->exposer_->RegisterCollectable(c);
  return s;
}

namespace {

// Opens and closes one TCP connection to `address` ("host:port"; a wildcard host as loopback).
void Knock(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), address.substr(colon + 1).c_str(), &hints, &found) != 0) return;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const timeval bound{0, 100'000};  // connect() waits at most this (a full backlog).
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof(bound));
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

}  // namespace

MetricsServer::~MetricsServer() {
  // CivetWeb (under prometheus::Exposer) notices that it is stopping only between polls of its
  // listening socket, which wait up to 2 s: measured 1.8 s for this destructor, in every process
  // of `pw down`. A connection ends the poll, so knock until the Exposer is gone.
  std::atomic<bool> gone{false};
  std::thread knocker([&] {
    while (!gone.load(std::memory_order_acquire)) {
      Knock(address_);
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  exposer_.reset();
  gone.store(true, std::memory_order_release);
  knocker.join();
}

}  // namespace pw::metrics
