#include "pw/embedded/embedded_cluster.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/trace/trace_json.h"

namespace pw {

absl::StatusOr<std::unique_ptr<EmbeddedCluster>> EmbeddedCluster::Create(const ClusterSpec& spec,
                                                                         Options options) {
  std::unique_ptr<EmbeddedCluster> c(new EmbeddedCluster(std::move(options)));
  if (!c->options_.trace_path.empty()) c->trace_since_ = trace::Recorder::Get().Start();
  Controller::Options controller = c->options_.controller;
  controller.hosts_share_process = true;
  if (!controller.on_run_done)
    controller.on_run_done = [runs = c->runs_](absl::Duration d, const absl::Status& s) {
      runs->Observe(d, s);
    };
  if (!controller.on_run_enqueued)
    controller.on_run_enqueued = [runs = c->runs_](absl::Duration d) { runs->ObserveDispatch(d); };
  c->controller_ = std::make_unique<Controller>(spec, controller);
  for (const auto& h : spec.hosts()) {
    std::vector<DeviceSpec> devices;
    for (DeviceId d : h.devices) devices.push_back(spec.device(d));
    PW_RETURN_IF_ERROR(c->StartWorker(h.id, h.island, devices));
  }
  return c;
}

absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> EmbeddedCluster::ServeMetrics(
    const std::string& listen) {
  return metrics::MetricsServer::Start(
      listen,
      [this] {
        absl::StatusOr<ClusterStatus> st = controller_->Status();
        if (!st.ok()) return metrics::Families();
        metrics::Families all = metrics::ClusterFamilies(*st, controller_->num_clients());
        // One family per name: a host's samples join the families of the hosts before it.
        for (const HostStatus& h : st->hosts) {
          for (auto& f : metrics::HostFamilies(h)) {
            auto same = std::find_if(all.begin(), all.end(),
                                     [&](const auto& g) { return g.name == f.name; });
            if (same == all.end()) {
              all.push_back(std::move(f));
            } else {
              for (auto& m : f.metric) same->metric.push_back(std::move(m));
            }
          }
        }
        return all;
      },
      {runs_->registry()});
}

std::string EmbeddedCluster::DefaultTracePath() {
  const char* path = std::getenv("PW_TRACE");
  return path == nullptr ? "" : path;
}

EmbeddedCluster::~EmbeddedCluster() {
  controller_.reset();
  if (trace_since_ >= 0) {
    trace::Recorder& r = trace::Recorder::Get();
    trace::Chunk chunk{r.Collect(trace_since_), {r.process_id()}, r.dropped(), trace::Now()};
    r.Stop();
    std::ofstream out(options_.trace_path);
    out << trace::ToChromeJson(chunk);
    std::fprintf(stderr, "pw: %s the trace of %zu events to %s (PW_TRACE)\n",
                 out.good() ? "wrote" : "could not write", chunk.events.size(),
                 options_.trace_path.c_str());
  }
  absl::flat_hash_map<HostId, std::unique_ptr<Host>> hosts;
  std::vector<std::unique_ptr<Host>> failed;
  std::vector<DeviceId> devices;
  {
    pw::MutexLock lock(&mu_);
    hosts.swap(hosts_);
    failed.swap(failed_);
    for (const auto& [id, spec] : devices_) devices.push_back(id);
  }
  // Every device leaves every host's collectives before any worker's threads are joined: no
  // shard waits for a host that is going (each worker fails its own device work as it goes).
  const absl::Status going = absl::CancelledError("the embedded cluster is shutting down");
  for (const auto& [id, host] : hosts)
    for (DeviceId d : devices) host->collectives->collectives().AbortDevice(d, going);
  hosts.clear();
  failed.clear();
}

EmbeddedCluster::Host::~Host() {
  collectives->CountOn(nullptr);
  worker.reset();
}

void EmbeddedCluster::AddDevices(const std::vector<DeviceSpec>& devices) {
  pw::MutexLock lock(&mu_);
  for (const DeviceSpec& d : devices) devices_[d.id] = d;
}

absl::StatusOr<DeviceSpec> EmbeddedCluster::Locate(DeviceId device) const {
  pw::MutexLock lock(&mu_);
  auto it = devices_.find(device);
  if (it == devices_.end())
    return absl::NotFoundError(absl::StrCat(device.ToString(), " is not in the cluster"));
  return it->second;
}

std::shared_ptr<InProcessCollectivePeers> EmbeddedCluster::CollectivesOf(HostId host) const {
  pw::MutexLock lock(&mu_);
  auto it = hosts_.find(host);
  return it == hosts_.end() ? nullptr : it->second->collectives;
}

absl::Status EmbeddedCluster::StartWorker(HostId host, IslandId island,
                                          const std::vector<DeviceSpec>& devices) {
  AddDevices(devices);
  std::vector<DeviceId> ids;
  for (const DeviceSpec& d : devices) ids.push_back(d.id);
  auto h = std::make_unique<Host>();
  // A communicator and a PJRT client of its own, fresh, as a (restarted) worker process has: an
  // SPMD XLA module lies within one host (Controller::CheckSpmdPlacement).
  auto pjrt = std::make_shared<pjrt::PjrtBackend>(options_.pjrt_plugin, ids);
  h->collectives = std::make_shared<InProcessCollectivePeers>(
      host, island, ids, [this](DeviceId d) { return Locate(d); },
      [this](HostId peer) { return CollectivesOf(peer); }, options_.collective_timeout);
  h->worker = std::make_unique<Worker>(
      host, island, devices, &h->collectives->collectives(),
      [this](HostId peer) -> WorkerInterface* { return worker(peer); }, std::move(pjrt));
  h->collectives->CountOn(h->worker.get());
  Worker* raw = h->worker.get();
  {
    pw::MutexLock lock(&mu_);
    if (hosts_.contains(host))  // Two restarts at once: the first one's worker stays.
      return absl::FailedPreconditionError(absl::StrCat(host.ToString(), " has a live worker"));
    hosts_[host] = std::move(h);
  }
  absl::Status joined = controller_->JoinHost(host, island, raw);
  // The controller failed the host again: so does its worker.
  if (!joined.ok()) (void)Retire(host, raw, std::string(joined.message()));
  return joined;
}

absl::Status EmbeddedCluster::FailHost(HostId host, const std::string& reason) {
  pw::MutexLock serial(&fail_mu_);
  PW_RETURN_IF_ERROR(Retire(host, nullptr, reason));
  controller_->FailHost(host, reason);
  return absl::OkStatus();
}

absl::Status EmbeddedCluster::Retire(HostId host, Worker* expected, const std::string& reason) {
  Worker* dead = nullptr;
  {
    pw::MutexLock lock(&mu_);
    auto it = hosts_.find(host);
    if (it == hosts_.end() || (expected != nullptr && it->second->worker.get() != expected))
      return absl::NotFoundError(absl::StrCat(host.ToString(), " has no live worker"));
    dead = it->second->worker.get();
    failed_.push_back(std::move(it->second));
    hosts_.erase(it);  // Peers find neither its worker nor its collectives from now on.
  }
  dead->Fail(absl::UnavailableError(absl::StrCat(host.ToString(), " failed: ", reason)));
  return absl::OkStatus();
}

absl::Status EmbeddedCluster::RestartHost(HostId host) {
  pw::MutexLock serial(&fail_mu_);
  bool failed = false;
  {
    pw::MutexLock lock(&mu_);
    if (hosts_.contains(host))
      return absl::FailedPreconditionError(absl::StrCat(host.ToString(), " has a live worker"));
    for (const auto& h : failed_) failed |= h->worker->host() == host;
  }
  if (!failed)
    return absl::NotFoundError(absl::StrCat(host.ToString(), " has not failed in this cluster"));
  const std::vector<DeviceSpec> devices = controller_->resource_manager().HostDevices(host);
  return StartWorker(host, devices.front().island, devices);
}

absl::StatusOr<HostRegistration> EmbeddedCluster::AddHost(IslandId island, int num_devices,
                                                          int64_t memory_bytes) {
  PW_ASSIGN_OR_RETURN(HostRegistration reg,
                      controller_->resource_manager().AddHost(
                          island, absl::StrCat("added-", island.value()), num_devices,
                          memory_bytes));
  PW_RETURN_IF_ERROR(StartWorker(reg.host, island, reg.devices));
  return reg;
}

Worker* EmbeddedCluster::worker(HostId host) const {
  pw::MutexLock lock(&mu_);
  auto it = hosts_.find(host);
  return it == hosts_.end() ? nullptr : it->second->worker.get();
}

}  // namespace pw
