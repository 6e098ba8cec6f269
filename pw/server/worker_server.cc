#include "pw/server/worker_server.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "pw/base/heap.h"
#include "pw/base/status_macros.h"
#include "pw/executor/block_cache.h"
#include "pw/rpc/wire.h"

namespace pw::server {
namespace v1 = ::pathways::v1;

std::string HostName();  // Below.

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

WorkerServer::WorkerServer(Options options)
    : options_(std::move(options)),
      machine_(options_.machine.empty() ? HostName() : options_.machine) {}

grpc::ClientContext* WorkerServer::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  rpc::AddToken(ctx, options_.channel.token);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(Options options) {
  if (options.channel.token.empty())
    return absl::InvalidArgumentError(
        "a worker needs the cluster token (--cluster-token or PW_CLUSTER_TOKEN) that its "
        "controller was given or printed");
  PW_RETURN_IF_ERROR(rpc::CheckListenAddress(options.listen, options.channel.token,
                                             options.channel.tls != nullptr, options.insecure));
  std::unique_ptr<WorkerServer> s(new WorkerServer(std::move(options)));
  dataplane::RemoveStaleSegments();  // Segments of killed workers on this machine.
  auto channel = rpc::MakeChannel(s->options_.controller, s->options_.channel,
                                  &s->controller_generation_);
  if (!rpc::WaitForConnected(*channel, s->options_.controller, s->controller_generation_,
                             absl::Now() + absl::Seconds(10)))
    return absl::UnavailableError(
        absl::StrCat("cannot reach the controller at ", s->options_.controller));
  s->controller_ = v1::Controller::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::Empty req;
    v1::Text resp;
    PW_RETURN_IF_ERROR(rpc::FromGrpc(
        s->controller_->GetClusterSpec(s->Prepare(&ctx, absl::Seconds(10)), req, &resp)));
    PW_ASSIGN_OR_RETURN(s->spec_, ClusterSpec::FromJson(resp.text()));
  }
  const HostId host = s->options_.host;
  if (!host.valid() || host.value() >= static_cast<int64_t>(s->spec_.hosts().size()))
    return absl::InvalidArgumentError(absl::StrCat(host.ToString(), " is not in the cluster (",
                                                   s->spec_.hosts().size(), " hosts)"));
  const HostSpec& hs = s->spec_.host(host);
  std::vector<DeviceSpec> devices;
  for (DeviceId d : hs.devices) devices.push_back(s->spec_.device(d));
  s->collectives_.SetPeers(s.get());
  s->collectives_.SetTimeout(s->options_.collective_timeout);
  s->worker_ = std::make_unique<Worker>(
      host, hs.island, devices, &s->collectives_, [p = s.get()](HostId h) { return p->Peer(h); },
      std::make_shared<pjrt::PjrtBackend>(s->options_.pjrt_plugin, hs.devices));
  // Peers on this machine send collective inputs and answers to fetches through shared memory.
  PW_ASSIGN_OR_RETURN(s->mailbox_, dataplane::ShmMailbox::Create([p = s.get()](
                                                                      absl::string_view m) {
                        p->ReceiveMail(m);
                      }));
  // Large shards for readers on other machines, on the interface that gRPC listens on, with the
  // same TLS.
  std::shared_ptr<const dataplane::TlsContext> bulk_tls;
  if (s->options_.channel.tls != nullptr) {
    PW_ASSIGN_OR_RETURN(bulk_tls, dataplane::TlsContext::Create(*s->options_.channel.tls, true));
  }
  // Clients' transfers waiting for their clients hold at most what this host's devices can.
  dataplane::BulkServer::ClientLimits client_limits;
  client_limits.max_client_bytes = 0;
  for (const DeviceSpec& d : devices) client_limits.max_client_bytes += d.memory_bytes;
  // In process (rpc/in_process.h) every peer shares this machine and no client dials directly:
  // no bulk stream, and no socket.
  if (!rpc::IsInProcess(s->options_.listen)) {
    PW_ASSIGN_OR_RETURN(s->bulk_, dataplane::BulkServer::Start(
                                      rpc::HostOf(s->options_.listen), s->options_.bulk_port,
                                      s->options_.channel.token, std::move(bulk_tls),
                                      client_limits));
  }
  s->service_ = std::make_unique<rpc::WorkerService>(
      s->worker_.get(), s->options_.channel.token,
      [p = s.get()](const v1::CollectiveContribution& c) { return p->ReceiveCollective(c); },
      s->bulk_.get(), [p = s.get()](const v1::HostTable& t) { p->SetHosts(t); },
      [w = s->worker_.get()](BufferId id, DeviceId d, const ArraySpec& spec,
                             Future<DeviceBufferRef> buffer) {
        return w->PutShardLater(id, d, spec, std::move(buffer));
      },
      [p = s.get()](const rpc::WorkerService::ReplyTo& reply,
                    const std::vector<v1::CommandEvent>& events) {
        return p->MailEvents(reply, events);
      },
      [p = s.get()](const v1::PeerMail& mail) { p->ReceivePeerMail(mail); });
  PW_ASSIGN_OR_RETURN(s->serving_,
                      rpc::StartServer(s->options_.listen, s->options_.channel, s->service_.get(),
                                       /*require_peer_certificate=*/true));
  // A wildcard listen address is advertised as this machine's name, which peers can dial.
  const std::string listen_host = s->options_.listen.substr(0, s->options_.listen.rfind(':'));
  const bool wildcard = listen_host == "0.0.0.0" || listen_host == "[::]";
  s->address_ = rpc::IsInProcess(s->options_.listen)
                    ? s->options_.listen
                    : absl::StrCat(wildcard ? HostName() : listen_host, ":", s->serving_.port);
  if (!s->options_.metrics_listen.empty()) {
    PW_ASSIGN_OR_RETURN(s->metrics_, metrics::MetricsServer::Start(
                                         s->options_.metrics_listen, [p = s.get()] {
                                           absl::StatusOr<HostStatus> st = p->worker_->Status().Await();
                                           return st.ok() ? metrics::HostFamilies(*st)
                                                          : metrics::Families();
                                         }));
  }
  PW_RETURN_IF_ERROR(s->Register());
  s->heartbeat_ = std::thread([p = s.get()] { p->HeartbeatLoop(); });
  return s;
}

WorkerServer::~WorkerServer() {
  {
    pw::MutexLock lock(&mail_gate_->mu);
    mail_gate_->server = nullptr;  // Mailed fetches whose shards become ready are not answered.
  }
  metrics_.reset();  // No scrape reads the worker from here on.
  Stop();
  if (heartbeat_.joinable()) heartbeat_.join();
  // Streams into this worker end now: their callers (the controller, peers) keep them open, and
  // the server would wait out its grace for them.
  if (service_ != nullptr)  // Not made when Start failed before it.
    service_->EndStreams(
        absl::UnavailableError(absl::StrCat(options_.host.ToString(), " is stopping")));
  serving_.Shutdown(absl::Seconds(2));
  // No transfer runs from here on (what was not taken fails): before the worker, whose buffers
  // the sends read. The server itself lives until the worker has drained: the worker's last
  // callbacks (a client fetch whose shard became ready, say) still offer on it, and are refused.
  if (bulk_ != nullptr) bulk_->Stop();
  // Nothing more from peers on this machine: the mailbox's deliveries use the worker.
  if (mailbox_ != nullptr) mailbox_->StopDelivering();
  worker_.reset();  // Fails outstanding device work, drains the worker's threads.
  service_.reset();
  bulk_.reset();
}

absl::Status WorkerServer::Register() {
  v1::RegisterWorkerRequest req;
  req.set_protocol_version(rpc::kProtocolVersion);
  req.set_host(options_.host.value());
  req.set_address(address_);
  req.set_machine(machine_);
  if (metrics_ != nullptr) req.set_metrics_address(metrics_->address());
  req.set_data_address(mailbox_->name());
  v1::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  const int64_t t0 = trace::Now();
  PW_RETURN_IF_ERROR(rpc::FromGrpc(
      controller_->RegisterWorker(Prepare(&ctx, absl::Seconds(30)), req, &resp)));
  service_->controller_clock().Sample(t0, resp.clock_ns(), trace::Now());
  if (resp.heartbeat_interval_ms() > 0)
    heartbeat_interval_ = absl::Milliseconds(resp.heartbeat_interval_ms());
  return absl::OkStatus();
}

void WorkerServer::Stop(const absl::Status& why) {
  pw::MutexLock lock(&mu_);
  if (stop_) return;
  stop_ = true;
  stop_reason_ = why;
}

absl::Status WorkerServer::WaitForStop() {
  pw::MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; });
  return stop_reason_;
}

void WorkerServer::HeartbeatLoop() {
  absl::Time last_ok = absl::Now();
  while (true) {
    const bool stop = mu_.LockWhenWithTimeout(
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; }, heartbeat_interval_);
    mu_.Unlock();
    if (stop) return;
    if (CheckOverruns(absl::Now())) return;
    BlockCache::ForHostBuffers().Trim();  // Shards' blocks idle too long: to the allocator,
    ReleaseFreeMemoryIfDue(absl::Now());  // and after large shards on the wire (pw/base/heap.h).
    v1::HeartbeatRequest req;
    req.set_host(options_.host.value());
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    const int64_t t0 = trace::Now();
    // In process, not on a channel whose server has gone (rpc/in_process.h).
    const rpc::InProcessCall call(options_.controller, controller_generation_);
    absl::Status s =
        call.ok()
            ? rpc::FromGrpc(controller_->Heartbeat(Prepare(&ctx, absl::Seconds(2)), req, &resp))
            : absl::UnavailableError(absl::StrCat(options_.controller,
                                                  " is no longer served by the controller this "
                                                  "worker joined"));
    if (s.ok()) service_->controller_clock().Sample(t0, resp.clock_ns(), trace::Now());
    if (absl::IsFailedPrecondition(s)) {
      // Declared failed (say, after a stall) or the controller restarted: what this process
      // holds is stale (its work was failed, its devices removed from the others' collectives).
      Stop(absl::AbortedError(absl::StrCat(
          options_.host.ToString(), ": the controller no longer counts this worker as live (",
          s.message(), "); exiting, to be restarted afresh")));
      return;
    }
    if (s.ok()) {
      last_ok = absl::Now();
    } else if (absl::Now() - last_ok > options_.controller_lost_timeout) {
      Stop(absl::UnavailableError(absl::StrCat(
          options_.host.ToString(), ": controller unreachable for ",
          absl::FormatDuration(absl::Now() - last_ok), " (", s.message(), "); exiting")));
      return;
    }
  }
}

bool WorkerServer::restart_requested() const {
  pw::MutexLock lock(&mu_);
  return restart_;
}

bool WorkerServer::CheckOverruns(absl::Time now) {
  if (options_.overrun_grace <= absl::ZeroDuration()) return false;
  std::vector<Worker::Overrun> overruns = worker_->Overrunning(now, options_.overrun_grace);
  if (overruns.empty()) return false;
  const Worker::Overrun& o = overruns.front();
  const absl::Status why = absl::AbortedError(absl::StrCat(
      options_.host.ToString(), ": ", o.device.ToString(), " still runs ", o.run.ToString(), " ",
      absl::FormatDuration(o.since_cancel), " after it was cancelled (", o.why.message(),
      "); a computation the runtime cannot interrupt holds it, so this worker restarts"));
  std::fprintf(stderr, "pw worker: %s\n", std::string(why.message()).c_str());
  {
    pw::MutexLock lock(&mu_);
    restart_ = true;
  }
  Stop(why);
  return true;
}

void WorkerServer::SetHosts(const v1::HostTable& table) {
  pw::MutexLock lock(&mu_);
  if (table.version() <= hosts_version_) return;  // An older table, overtaken.
  hosts_version_ = table.version();
  absl::flat_hash_map<HostId, v1::HostAddress> hosts;
  for (const v1::HostAddress& a : table.hosts()) hosts[HostId(a.host())] = a;
  // A peer that left, or is somewhere else now: its stub and mailbox go (work that holds the
  // stub keeps it: stubs_); the next use makes them from the table.
  for (auto it = hosts_.begin(); it != hosts_.end(); ++it) {
    auto now = hosts.find(it->first);
    if (now != hosts.end() && now->second.address() == it->second.address() &&
        now->second.data_address() == it->second.data_address())
      continue;
    peers_.erase(it->first);
    mailboxes_.erase(it->first);
    reply_mailboxes_.erase(it->first);
  }
  hosts_ = std::move(hosts);
}

std::string WorkerServer::PeerAddress(HostId host) const {
  pw::MutexLock lock(&mu_);
  auto it = hosts_.find(host);
  return it == hosts_.end() ? "" : it->second.address();
}

rpc::RemoteWorker* WorkerServer::RemotePeer(HostId host) {
  while (true) {
    v1::HostAddress listed;
    {
      pw::MutexLock lock(&mu_);
      auto it = peers_.find(host);
      if (it != peers_.end()) return it->second;
      auto found = hosts_.find(host);
      if (found == hosts_.end()) return nullptr;  // Not a live member now.
      listed = found->second;
    }
    // Made outside the lock (no network: a channel connects on first use, a mailbox is a
    // shared-memory segment of this machine).
    const bool same_machine = listed.machine() == machine_;
    auto stub = std::make_unique<rpc::RemoteWorker>(host, listed.address(), options_.channel,
                                                    same_machine);
    std::shared_ptr<dataplane::ShmMailbox> mailbox;
    if (same_machine && !listed.data_address().empty()) {
      auto m = dataplane::ShmMailbox::Open(listed.data_address());
      if (m.ok()) mailbox = *std::move(m);  // Otherwise collectives go by RPC.
    }
    pw::MutexLock lock(&mu_);
    auto now = hosts_.find(host);
    if (now == hosts_.end() || now->second.address() != listed.address()) continue;  // Moved.
    if (mailbox != nullptr && !mailboxes_.contains(host)) mailboxes_[host] = mailbox;
    auto& slot = peers_[host];
    if (slot == nullptr) {
      // Fetches of small shards from a worker on this machine go to its mailbox, and come back
      // through ours.
      if (same_machine) {
        stub->UseMailboxes(
            options_.host, mailbox_->name(),
            mailbox == nullptr ? nullptr : std::function<bool(const v1::PeerMail&)>(
                                               [mailbox](const v1::PeerMail& m) {
                                                 return mailbox->Send(m.SerializeAsString()).ok();
                                               }));
      }
      slot = stub.get();
      stubs_by_mail_id_[stub->mail_id()] = stub.get();
      stubs_.push_back(std::move(stub));
    }
    return slot;
  }
}

void WorkerServer::ForgetPeer(HostId host, rpc::RemoteWorker* stale) {
  pw::MutexLock lock(&mu_);
  auto it = peers_.find(host);
  if (it != peers_.end() && it->second == stale) {
    peers_.erase(it);
    mailboxes_.erase(host);
  }
}

void WorkerServer::SendTo(HostId h, const v1::CollectiveContribution& c,
                          std::function<void(const absl::Status&)> on_error) {
  rpc::RemoteWorker* peer = RemotePeer(h);  // Also opens the mailbox of a peer on this machine.
  std::shared_ptr<dataplane::ShmMailbox> mailbox;
  {
    pw::MutexLock lock(&mu_);
    auto it = mailboxes_.find(h);
    if (it != mailboxes_.end()) mailbox = it->second;
  }
  if (mailbox != nullptr) {
    v1::PeerMail mail;
    *mail.mutable_collective() = c;
    if (mailbox->Send(mail.SerializeAsString()).ok()) return;
  }
  if (peer == nullptr)
    return on_error(absl::UnavailableError(absl::StrCat("cannot find the worker of ", h.ToString())));
  peer->SendCollective(c, [this, c, h, peer, on_error](const absl::Status& s) {
    // The peer may have rejoined at a new address: look it up again and resend once.
    ForgetPeer(h, peer);
    rpc::RemoteWorker* fresh = RemotePeer(h);
    if (fresh != nullptr && fresh->address() != peer->address())
      return fresh->SendCollective(c, on_error);
    on_error(s);
  });
}

WorkerInterface* WorkerServer::Peer(HostId host) {
  if (host == options_.host) return worker_.get();
  return RemotePeer(host);
}

bool WorkerServer::IsLocal(DeviceId device) const {
  return device.valid() && device.value() < static_cast<int64_t>(spec_.devices().size()) &&
         spec_.device(device).host == options_.host;
}

std::vector<HostId> WorkerServer::RemoteHosts(absl::Span<const DeviceId> devices) const {
  std::vector<HostId> hosts;
  for (DeviceId d : devices) {
    if (IsLocal(d) || !d.valid() || d.value() >= static_cast<int64_t>(spec_.devices().size()))
      continue;
    HostId h = spec_.device(d).host;
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  return hosts;
}

CollectivePeers::Processes WorkerServer::ProcessesOf(absl::Span<const DeviceId> devices) const {
  std::vector<HostId> hosts = ProcessHosts(devices);
  Processes p{static_cast<int>(hosts.size()), 0};
  for (size_t i = 0; i < hosts.size(); ++i)
    if (hosts[i] == options_.host) p.self = static_cast<int>(i);
  return p;
}

std::vector<HostId> WorkerServer::ProcessHosts(absl::Span<const DeviceId> devices) const {
  std::vector<HostId> hosts;
  for (DeviceId d : devices) {
    if (!d.valid() || d.value() >= static_cast<int64_t>(spec_.devices().size())) continue;
    HostId h = spec_.device(d).host;
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  return hosts;
}

void WorkerServer::SendPiece(const CollectiveKey& key, absl::Span<const DeviceId> devices,
                             int phase, int to, int from, size_t offset, std::string bytes) {
  std::vector<HostId> hosts = ProcessHosts(devices);
  v1::CollectiveContribution c;
  c.set_from_island(spec_.host(options_.host).island.value());
  c.set_run(key.run);
  c.set_node(key.node);
  c.set_op(key.op);
  c.set_group(key.group);
  c.set_phase(phase);
  c.set_from_process(from);
  c.set_offset(static_cast<int64_t>(offset));
  c.add_inputs(std::move(bytes));
  std::vector<DeviceId> all(devices.begin(), devices.end());
  if (to < 0 || to >= static_cast<int>(hosts.size())) return;
  SendTo(hosts[to], c, [this, key, all](const absl::Status& s) {
    collectives_.FailLaunch(key.run, key.node, Annotate(s, "collective"), all);
  });
}

namespace {
v1::PeerMail MailOfEvents(HostId from, uint64_t reply_stub,
                          const std::vector<v1::CommandEvent>& events) {
  v1::PeerMail mail;
  v1::MailedEvents* m = mail.mutable_events();
  m->set_from_host(from.value());
  m->set_stub(reply_stub);
  for (const v1::CommandEvent& e : events) *m->add_events() = e;
  return mail;
}
}  // namespace

std::shared_ptr<dataplane::ShmMailbox> WorkerServer::ReplyMailbox(HostId host,
                                                                 const std::string& name) {
  {
    pw::MutexLock lock(&mu_);
    auto it = reply_mailboxes_.find(host);
    if (it != reply_mailboxes_.end() && it->second->name() == name) return it->second;
  }
  // Not opened yet, or the host's worker is a new process: by the name the reader gave, not
  // the host table, which may not list it yet (or still list its predecessor).
  auto opened = dataplane::ShmMailbox::Open(name);
  if (!opened.ok()) return nullptr;  // Gone (or not a mailbox).
  std::shared_ptr<dataplane::ShmMailbox> mailbox = *std::move(opened);
  pw::MutexLock lock(&mu_);
  reply_mailboxes_[host] = mailbox;
  return mailbox;
}

bool WorkerServer::MailEvents(const rpc::WorkerService::ReplyTo& reply,
                              const std::vector<v1::CommandEvent>& events) {
  if (reply.host == options_.host) return false;
  std::shared_ptr<dataplane::ShmMailbox> mailbox = ReplyMailbox(reply.host, reply.mailbox);
  return mailbox != nullptr &&
         mailbox->Send(MailOfEvents(options_.host, reply.stub, events).SerializeAsString()).ok();
}

void WorkerServer::AnswerMailedFetches(const rpc::WorkerService::ReplyTo& reply,
                                       const std::vector<v1::CommandEvent>& events) {
  if (MailEvents(reply, events)) {
    service_->CountMailedEvents(static_cast<int64_t>(events.size()));
    return;
  }
  // No room in its mailbox (or it is gone): by RPC, whose failure means the reader is gone or
  // unreachable, and with it what waits for these (its stream to us ends too).
  rpc::RemoteWorker* peer = RemotePeer(reply.host);
  if (peer != nullptr)
    peer->SendMail(MailOfEvents(options_.host, reply.stub, events), [](const absl::Status&) {});
}

void WorkerServer::ReceiveMail(absl::string_view message) {
  v1::PeerMail mail;
  if (!mail.ParseFromArray(message.data(), static_cast<int>(message.size()))) return;
  // The controller's commands (it runs on this machine) come only this way, not by Mail.
  if (mail.has_commands()) return service_->ApplyMailedCommands(*mail.mutable_commands());
  ReceivePeerMail(mail);
}

void WorkerServer::ReceivePeerMail(const v1::PeerMail& mail) {
  if (mail.has_collective()) {
    (void)ReceiveCollective(mail.collective());
    return;
  }
  if (mail.has_fetches()) {
    service_->AnswerMailedFetches(
        mail.fetches(), [gate = mail_gate_](const rpc::WorkerService::ReplyTo& reply,
                                            std::vector<v1::CommandEvent> events) {
          pw::MutexLock lock(&gate->mu);
          if (gate->server != nullptr) gate->server->AnswerMailedFetches(reply, events);
        });
    return;
  }
  if (!mail.has_events()) return;
  rpc::RemoteWorker* stub = nullptr;
  {
    pw::MutexLock lock(&mu_);
    auto it = stubs_by_mail_id_.find(mail.events().stub());
    if (it != stubs_by_mail_id_.end()) stub = it->second;  // Stubs live as long as this server.
  }
  if (stub != nullptr) stub->OnMailedEvents(mail.events());
}

absl::Status WorkerServer::ReceiveCollective(const v1::CollectiveContribution& c) {
  // Counted before delivery, which may complete the collective: whoever sees its result sees
  // these bytes counted.
  int64_t bytes = 0;
  for (const std::string& in : c.inputs()) bytes += static_cast<int64_t>(in.size());
  const bool same_island = c.from_island() == spec_.host(options_.host).island.value();
  worker_->CountReceived(same_island ? LinkClass::kIci : LinkClass::kDcn, bytes, bytes);
  return rpc::WorkerService::Deliver(&collectives_, c);
}

void WorkerServer::Send(const CollectiveKey& key, absl::Span<const DeviceId> devices,
                        std::vector<int> ranks, std::vector<std::string> inputs) {
  v1::CollectiveContribution c;
  c.set_from_island(spec_.host(options_.host).island.value());
  c.set_run(key.run);
  c.set_node(key.node);
  c.set_op(key.op);
  c.set_group(key.group);
  for (size_t i = 0; i < ranks.size(); ++i) {
    c.add_ranks(ranks[i]);
    c.add_inputs(std::move(inputs[i]));
  }
  std::vector<DeviceId> all(devices.begin(), devices.end());
  for (HostId h : RemoteHosts(devices)) {
    SendTo(h, c, [this, key, all](const absl::Status& s) {
      // Fails the launch here and tells the other processes, whose shards wait for ours.
      collectives_.FailLaunch(key.run, key.node, Annotate(s, "collective"), all);
    });
  }
}

void WorkerServer::SendFailure(int64_t run, int32_t node, absl::Span<const DeviceId> devices,
                               const absl::Status& reason) {
  v1::CollectiveContribution c;
  c.set_run(run);
  c.set_node(node);
  rpc::ToProto(reason, c.mutable_error());
  for (HostId h : RemoteHosts(devices))
    SendTo(h, c, [](const absl::Status&) {});  // The peer is gone: nothing waits there.
}

}  // namespace pw::server
