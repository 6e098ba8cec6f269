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
  // One PJRT client for all the hosts of this process: SPMD functions can span them.
  std::vector<DeviceId> all;
  for (const auto& h : spec.hosts()) all.insert(all.end(), h.devices.begin(), h.devices.end());
  c->pjrt_ = std::make_shared<pjrt::PjrtBackend>(c->options_.pjrt_plugin, std::move(all));
  for (const auto& h : spec.hosts()) {
    std::vector<DeviceSpec> devices;
    for (DeviceId d : h.devices) devices.push_back(spec.device(d));
    PW_RETURN_IF_ERROR(c->StartWorker(h.id, h.island, devices, c->pjrt_));
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
  absl::flat_hash_map<HostId, std::unique_ptr<Worker>> workers;
  std::vector<std::unique_ptr<Worker>> failed;
  {
    pw::MutexLock lock(&mu_);
    workers.swap(workers_);
    failed.swap(failed_);
  }
  // Fail outstanding device work everywhere before any worker's threads are joined.
  workers.clear();
  failed.clear();
}

absl::Status EmbeddedCluster::StartWorker(HostId host, IslandId island,
                                          const std::vector<DeviceSpec>& devices,
                                          std::shared_ptr<pjrt::PjrtBackend> pjrt) {
  auto w = std::make_unique<Worker>(host, island, devices, &collectives_,
                                    [this](HostId h) -> WorkerInterface* { return worker(h); },
                                    std::move(pjrt));
  Worker* raw = w.get();
  {
    pw::MutexLock lock(&mu_);
    if (workers_.contains(host))  // Two restarts at once: the first one's worker stays.
      return absl::FailedPreconditionError(absl::StrCat(host.ToString(), " has a live worker"));
    workers_[host] = std::move(w);
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
    auto it = workers_.find(host);
    if (it == workers_.end() || (expected != nullptr && it->second.get() != expected))
      return absl::NotFoundError(absl::StrCat(host.ToString(), " has no live worker"));
    dead = it->second.get();
    failed_.push_back(std::move(it->second));
    workers_.erase(it);  // Peers find no worker for it from now on.
  }
  dead->Fail(absl::UnavailableError(absl::StrCat(host.ToString(), " failed: ", reason)));
  return absl::OkStatus();
}

absl::Status EmbeddedCluster::RestartHost(HostId host) {
  pw::MutexLock serial(&fail_mu_);
  std::shared_ptr<pjrt::PjrtBackend> pjrt;
  bool failed = false;
  {
    pw::MutexLock lock(&mu_);
    if (workers_.contains(host))
      return absl::FailedPreconditionError(absl::StrCat(host.ToString(), " has a live worker"));
    for (const auto& w : failed_) {
      if (w->host() != host) continue;
      failed = true;
      pjrt = w->pjrt_backend();  // The PJRT client it had (SPMD functions span it as before).
    }
  }
  if (!failed)
    return absl::NotFoundError(absl::StrCat(host.ToString(), " has not failed in this cluster"));
  const std::vector<DeviceSpec> devices = controller_->resource_manager().HostDevices(host);
  // The collectives the hosts share: its devices meet again (a restarted process has its own,
  // fresh; JoinHost tells only the other workers).
  for (const DeviceSpec& d : devices) collectives_.RestoreDevice(d.id);
  return StartWorker(host, devices.front().island, devices, std::move(pjrt));
}

absl::StatusOr<HostRegistration> EmbeddedCluster::AddHost(IslandId island, int num_devices,
                                                          int64_t memory_bytes) {
  PW_ASSIGN_OR_RETURN(HostRegistration reg,
                      controller_->resource_manager().AddHost(
                          island, absl::StrCat("added-", island.value()), num_devices,
                          memory_bytes));
  // A host added at run time has its own PJRT client (SPMD functions cannot span it and others).
  std::vector<DeviceId> ids;
  for (const DeviceSpec& d : reg.devices) ids.push_back(d.id);
  PW_RETURN_IF_ERROR(StartWorker(reg.host, island, reg.devices,
                                 std::make_shared<pjrt::PjrtBackend>(options_.pjrt_plugin, ids)));
  return reg;
}

Worker* EmbeddedCluster::worker(HostId host) const {
  pw::MutexLock lock(&mu_);
  auto it = workers_.find(host);
  return it == workers_.end() ? nullptr : it->second.get();
}

}  // namespace pw
