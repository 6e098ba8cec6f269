#include "pw/server/controller_server.h"

#include <sys/mman.h>
#include <unistd.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pw/base/heap.h"
#include "pw/base/status_macros.h"
#include "pw/executor/block_cache.h"
#include "pw/rpc/mail.h"
#include "pw/rpc/wire.h"

namespace pw::server {
namespace v1 = ::pathways::v1;

constexpr int64_t kControllerThreadCacheBytes = int64_t{4} << 20;

ControllerServer::ControllerServer(const ClusterSpec& spec, Options options)
    : spec_(spec), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(const ClusterSpec& spec,
                                                                          Options options) {
  PW_RETURN_IF_ERROR(rpc::CheckListenAddress(options.listen, options.channel.token,
                                             options.channel.tls != nullptr, options.insecure));
  if (options.cluster_token.empty()) options.cluster_token = NewSecret();
  // The controller's live heap is about 1.5 MiB; tcmalloc's default thread caches (32 MiB in all)
  // grew its heap from 9 to 26 MiB over a 5-minute chaos run (pw/base/heap.h).
  LimitThreadCaches(kControllerThreadCacheBytes);
  std::unique_ptr<ControllerServer> s(new ControllerServer(spec, std::move(options)));
  s->trace_queue_ = std::make_unique<WorkQueue>("pw-traces");
  auto runs = std::make_shared<metrics::RunMetrics>();
  s->controller_ = std::make_unique<Controller>(
      spec, Controller::Options{.hosts_share_process = false,
                                .default_run_timeout = s->options_.default_run_timeout,
                                .max_program_nodes = s->options_.max_program_nodes,
                                .definitions = s->options_.definitions,
                                .max_client_bytes = s->options_.max_client_bytes,
                                .scheduling = s->options_.scheduling,
                                .checkpoint_root = s->options_.checkpoint_root,
                                .on_run_done = [runs](absl::Duration d, const absl::Status& st) {
                                  runs->Observe(d, st);
                                },
                                .on_run_enqueued = [runs](absl::Duration d) {
                                  runs->ObserveDispatch(d);
                                },
                                .start_remote_traces = [p = s.get()] { p->TraceWorkers(true); },
                                .stop_remote_traces =
                                    [p = s.get()] {
                                      // On its own thread: a disconnect (on a gRPC thread) ends
                                      // a client's trace without waiting on the workers.
                                      Promise<trace::Chunk> chunk;
                                      Future<trace::Chunk> f = chunk.future();
                                      p->trace_queue_->Post([p, chunk = std::move(chunk)]() mutable {
                                        chunk.Set(p->TraceWorkers(false));
                                      });
                                      return f;
                                    }});
  s->service_ = std::make_unique<rpc::ControllerService>(
      s->controller_.get(), s.get(), s->options_.channel.token, s->options_.cluster_token,
      s->options_.clients);
  if (s->options_.mail_commands || s->options_.mail_sessions) {
    auto mailbox = dataplane::ShmMailbox::Create([p = s.get()](absl::string_view message) {
      p->ReceiveMail(message);
    });
    if (mailbox.ok()) {
      s->mailbox_ = *std::move(mailbox);
      if (s->options_.mail_sessions) s->service_->UseMailbox(s->mailbox_->name());
    } else {
      std::fprintf(stderr, "pw controller: no mailbox (%s): commands and sessions go on the "
                   "streams\n", std::string(mailbox.status().message()).c_str());
    }
  }
  PW_ASSIGN_OR_RETURN(s->serving_,
                      rpc::StartServer(s->options_.listen, s->options_.channel, s->service_.get(),
                                       /*require_peer_certificate=*/false));
  const std::string host = s->options_.listen.substr(0, s->options_.listen.rfind(':'));
  s->address_ = rpc::IsInProcess(s->options_.listen)
                    ? s->options_.listen
                    : absl::StrCat(host == "0.0.0.0" || host == "[::]" ? "127.0.0.1" : host, ":",
                                   s->serving_.port);
  if (!s->options_.metrics_listen.empty()) {
    PW_ASSIGN_OR_RETURN(s->metrics_,
                        metrics::MetricsServer::Start(
                            s->options_.metrics_listen,
                            [p = s.get()]() -> metrics::Families {
                              absl::StatusOr<ClusterStatus> st = p->controller_->Status();
                              if (!st.ok()) return {};
                              return metrics::ClusterFamilies(*st, p->service_->num_clients());
                            },
                            {runs->registry()}));
  }
  s->monitor_ = std::thread([p = s.get()] { p->MonitorLoop(); });
  return s;
}

std::string ControllerServer::metrics_address() const {
  return metrics_ == nullptr ? "" : metrics_->address();
}

ControllerServer::~ControllerServer() {
  metrics_.reset();  // No scrape reads the controller from here on.
  Shutdown();
  if (monitor_.joinable()) monitor_.join();  // Not started when Start failed.
  // Fail what is outstanding on the workers first, so no run waits on a worker that will not
  // answer; then stop serving, then stop the controller. Calls in flight get kShutdownGrace to
  // end; then gRPC cancels them, and so the clients' Session streams, which their clients keep
  // open (a connected client held `pw down` for the whole grace, 2 s before).
  {
    pw::MutexLock lock(&mu_);
    for (auto& w : workers_) w->Fail("the controller is shutting down");
  }
  serving_.Shutdown(kShutdownGrace);
  if (mailbox_ != nullptr) mailbox_->StopDelivering();  // Before the stubs it hands events to.
  if (service_ != nullptr) service_->StopSessionMail();  // Before the controller they submit to.
  controller_.reset();
  service_.reset();
  trace_queue_.reset();  // Ends the traces still being gathered (failed workers are skipped).
  pw::MutexLock lock(&mu_);
  workers_.clear();
}

int64_t ControllerServer::commands_mailed() const {
  pw::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& w : workers_) n += w->commands_mailed();
  return n;
}

void ControllerServer::ReceiveMail(absl::string_view message) {
  v1::PeerMail mail;
  if (!mail.ParseFromArray(message.data(), static_cast<int>(message.size()))) return;
  if (mail.has_session()) return service_->ReceiveSessionMail(mail.mutable_session());
  if (!mail.has_events()) return;
  rpc::RemoteWorker* stub = nullptr;
  {
    pw::MutexLock lock(&mail_mu_);
    auto it = stubs_by_mail_id_.find(mail.events().stub());
    if (it != stubs_by_mail_id_.end()) stub = it->second;  // Stubs live as long as this server.
  }
  if (stub != nullptr) stub->OnMailedEvents(mail.events());
}

void ControllerServer::Shutdown() {
  pw::MutexLock lock(&mu_);
  shutdown_ = true;
}

void ControllerServer::WaitForShutdown() {
  pw::MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return shutdown_; });
}

int ControllerServer::alive_hosts() const {
  pw::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [h, m] : members_) n += m.alive;
  return n;
}

absl::StatusOr<v1::RegisterWorkerResponse> ControllerServer::RegisterWorker(
    const v1::RegisterWorkerRequest& req) {
  const HostId host(req.host());
  if (!host.valid() || host.value() >= static_cast<int64_t>(spec_.hosts().size())) {
    return absl::NotFoundError(absl::StrCat("host:", req.host(), " is not in this cluster (",
                                            spec_.hosts().size(), " hosts)"));
  }
  if (req.address().empty())
    return absl::InvalidArgumentError("RegisterWorker: the worker sent no address");
  bool rejoin = false;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  {
    pw::MutexLock lock(&mu_);
    auto it = members_.find(host);
    rejoin = it != members_.end();
    // The replaced worker's shared-memory mailbox outlives a killed process: remove it (unless
    // the same process registers again with the same, live mailbox).
    if (rejoin && it->second.machine == name && it->second.data_address != req.data_address() &&
        it->second.data_address.rfind("/pw-mbox-", 0) == 0)
      shm_unlink(it->second.data_address.c_str());
  }
  // A host registering again replaces its old worker (which may not have been noticed dead yet).
  if (rejoin) {
    FailHost(host, "its worker registered again");
    // A failure the monitor had under way ends first: it must not detach the new worker.
    pw::MutexLock lock(&mu_);
    mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !members_[host].failing; });
  }
  rpc::ChannelOptions to_worker = options_.channel;
  to_worker.token = options_.cluster_token;
  const bool same_machine = req.machine() == name;
  auto worker = std::make_unique<rpc::RemoteWorker>(host, req.address(), to_worker, same_machine,
                                                    options_.lazy_command_flush);
  rpc::RemoteWorker* w = worker.get();
  if (same_machine && options_.mail_commands && mailbox_ != nullptr && !req.data_address().empty()) {
    if (auto to = dataplane::ShmMailbox::Open(req.data_address()); to.ok()) {
      std::shared_ptr<dataplane::ShmMailbox> to_mailbox = *std::move(to);
      w->MailCommands(mailbox_->name(), [to_mailbox](const v1::PeerMail& m) {
        // A batch the mailbox cannot take (a large put) is not serialized for nothing.
        return rpc::SendMail(*to_mailbox, m).ok();
      });
      pw::MutexLock lock(&mail_mu_);
      stubs_by_mail_id_[w->mail_id()] = w;
    }
  }
  w->OpenCommandStream();
  {
    // Listed, and every worker told (this one included), before it is attached: any work that
    // names it reaches each worker behind the table that says where it is.
    pw::MutexLock lock(&mu_);
    workers_.push_back(std::move(worker));
    Member& m = members_[host];
    m.address = req.address();
    m.data_address = req.data_address();
    m.machine = req.machine();
    m.metrics_address = req.metrics_address();
    m.worker = w;
    m.listed = true;
    PushHostsLocked();
  }
  const absl::Status attached = controller_->JoinHost(host, spec_.host(host).island, w);
  if (!attached.ok()) {  // It never joined: unlisted again.
    pw::MutexLock lock(&mu_);
    members_[host].listed = false;
    PushHostsLocked();
    return attached;
  }
  {
    pw::MutexLock lock(&mu_);
    Member& m = members_[host];
    m.last_heartbeat = absl::Now();
    m.alive = true;
    m.reason.clear();
  }
  std::fprintf(stderr, "pw controller: %s %s at %s\n", host.ToString().c_str(),
               rejoin ? "rejoined" : "joined", req.address().c_str());
  v1::RegisterWorkerResponse resp;
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  resp.set_clock_ns(trace::Now());
  return resp;
}

trace::Chunk ControllerServer::TraceWorkers(bool start) {
  std::vector<rpc::RemoteWorker*> workers;
  {
    pw::MutexLock lock(&mu_);
    for (const auto& [host, m] : members_)
      if (m.alive && m.worker != nullptr && m.worker->failure().empty())
        workers.push_back(m.worker);
  }
  // In parallel: a slow worker costs its own deadline, not one per worker.
  std::vector<absl::StatusOr<trace::Chunk>> got(workers.size());
  std::vector<std::thread> asks;
  for (size_t i = 0; i < workers.size(); ++i)
    asks.emplace_back([&, i] { got[i] = workers[i]->Trace(start); });
  for (std::thread& t : asks) t.join();
  trace::Chunk all;
  // Workers in this process (tests) record into the controller's recorder: taken once, there.
  absl::flat_hash_set<uint64_t> seen = {trace::Recorder::Get().process_id()};
  for (absl::StatusOr<trace::Chunk>& c : got) {
    if (!c.ok()) {  // Its spans are missing; the trace says so.
      std::fprintf(stderr, "pw controller: trace: %s\n", std::string(c.status().message()).c_str());
      continue;
    }
    if (!c->processes.empty() && !seen.insert(c->processes.front()).second) continue;
    all.events.insert(all.events.end(), std::make_move_iterator(c->events.begin()),
                      std::make_move_iterator(c->events.end()));
    all.processes.insert(all.processes.end(), c->processes.begin(), c->processes.end());
    all.dropped += c->dropped;
  }
  return all;
}

absl::Status ControllerServer::Heartbeat(HostId host) {
  pw::MutexLock lock(&mu_);
  auto it = members_.find(host);
  if (it == members_.end() || !it->second.alive)
    return absl::FailedPreconditionError(absl::StrCat(
        host.ToString(), " is not a live member",
        it == members_.end() ? "" : absl::StrCat(" (", it->second.reason, ")")));
  it->second.last_heartbeat = absl::Now();
  return absl::OkStatus();
}

void ControllerServer::PushHostsLocked() {
  v1::HostTable table;
  table.set_version(++hosts_version_);
  for (const auto& [host, m] : members_) {
    if (!m.listed) continue;
    v1::HostAddress* a = table.add_hosts();
    a->set_host(host.value());
    a->set_address(m.address);
    a->set_data_address(m.data_address);
    a->set_machine(m.machine);
  }
  for (const auto& [host, m] : members_)
    if (m.listed) m.worker->SetHosts(table);
}

void ControllerServer::AddMembers(v1::ClusterStatus* out) {
  out->set_metrics_address(metrics_address());
  pw::MutexLock lock(&mu_);
  for (const HostSpec& h : spec_.hosts()) {
    v1::HostMembership* m = out->add_members();
    m->set_host(h.id.value());
    auto it = members_.find(h.id);
    if (it == members_.end()) {
      m->set_reason("never registered");
      continue;
    }
    m->set_address(it->second.address);
    m->set_metrics_address(it->second.metrics_address);
    m->set_alive(it->second.alive);
    m->set_reason(it->second.reason);
  }
}

void ControllerServer::FailHost(HostId host, const std::string& reason,
                                rpc::RemoteWorker* observed) {
  rpc::RemoteWorker* w = nullptr;
  {
    pw::MutexLock lock(&mu_);
    auto it = members_.find(host);
    if (it == members_.end() || !it->second.alive || it->second.failing) return;
    if (observed != nullptr && it->second.worker != observed) return;  // It has rejoined since.
    it->second.failing = true;
    w = it->second.worker;
  }
  std::fprintf(stderr, "pw controller: %s failed: %s\n", host.ToString().c_str(), reason.c_str());
  // Outstanding commands fail now, naming the host; then its devices leave service, which also
  // aborts the other workers' collectives that wait on them. The host counts as alive until
  // all of that is done, so whoever sees it dead also sees its devices gone.
  w->Fail(reason);
  controller_->FailHost(host, reason);
  pw::MutexLock lock(&mu_);
  Member& m = members_[host];
  m.alive = false;
  m.failing = false;
  m.reason = reason;
  if (m.listed) {  // Peers drop what they hold for it (a rejoin lists it at its new address).
    m.listed = false;
    PushHostsLocked();
  }
}

absl::StatusOr<std::vector<RunId>> ControllerServer::Cancel(const v1::CancelRequest& req) {
  const std::string why = req.reason().empty() ? "" : absl::StrCat(": ", req.reason());
  switch (req.target_case()) {
    case v1::CancelRequest::kRun: {
      const RunId run(req.run());
      PW_RETURN_IF_ERROR(controller_->CancelRun(
          run, absl::CancelledError(absl::StrCat(run.ToString(), " was cancelled by the cluster's "
                                                 "admin", why))));
      return std::vector<RunId>{run};
    }
    case v1::CancelRequest::kClient: {
      const ClientId client(req.client());
      return controller_->CancelClientRuns(
          client, absl::CancelledError(absl::StrCat("the runs of ", client.ToString(),
                                                    " were cancelled by the cluster's admin", why)));
    }
    default:
      return absl::InvalidArgumentError("Cancel names neither a run nor a client");
  }
}

void ControllerServer::MonitorLoop() {
  const absl::Duration tick = std::min(options_.heartbeat_interval, options_.failure_timeout / 4);
  while (true) {
    const bool stop = mu_.LockWhenWithTimeout(
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return shutdown_; }, tick);
    mu_.Unlock();
    if (stop) return;
    service_->ReapSessionless(absl::Now());
    BlockCache::ForHostBuffers().Trim();  // Fetched shards' blocks idle too long: to the
    ReleaseFreeMemoryIfDue(absl::Now());  // allocator, and after large puts and fetches.
    struct Failed {
      HostId host;
      rpc::RemoteWorker* worker;  // The worker observed failing (the host may rejoin meanwhile).
      std::string why;
    };
    std::vector<Failed> failed;
    std::vector<std::pair<HostId, rpc::RemoteWorker*>> live;
    {
      pw::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      for (const auto& [h, m] : members_) {
        if (!m.alive || m.failing) continue;
        if (now - m.last_heartbeat > options_.failure_timeout) {
          failed.push_back({h, m.worker, absl::StrFormat("no heartbeat for %d ms",
                                                         absl::ToInt64Milliseconds(
                                                             now - m.last_heartbeat))});
        } else {
          live.emplace_back(h, m.worker);
        }
      }
    }
    // A broken command stream fails the host too (its process died, or was told it failed).
    for (const auto& [h, w] : live)
      if (std::string why = w->failure(); !why.empty()) failed.push_back({h, w, why});
    for (const Failed& f : failed) FailHost(f.host, f.why, f.worker);
  }
}

}  // namespace pw::server
