// WorkerServer: the `pw worker` process for one host. Its Worker (device executors, object-store
// shard, data plane) served over gRPC; registration with the controller, heartbeats, and the
// links to peer workers: FetchShard pulls from peers' WorkerService (never through the
// controller: shared memory on this machine; from other machines, chunked gRPC streams, or for
// large shards the peer's bulk stream, a plain TCP socket), and native collectives exchange
// inputs with the processes holding the slice's other devices.
//
// Thread-safe. If the controller declares this host failed (e.g. after a pause), the next
// heartbeat learns it and the server stops with that reason (`pw worker` exits with status 1, to
// be restarted afresh); so it does if the controller cannot be reached for
// `controller_lost_timeout`.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "pw/base/mutex.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/dataplane/shm_mailbox.h"
#include "pw/executor/collectives.h"
#include "pw/metrics/metrics.h"
#include "pw/pjrt/pjrt_backend.h"
#include "pw/rpc/auth.h"
#include "pw/rpc/proto/pathways.grpc.pb.h"
#include "pw/rpc/remote_worker.h"
#include "pw/rpc/worker_service.h"
#include "pw/worker/worker.h"

namespace pw::server {

class WorkerServer final : public CollectivePeers {
 public:
  struct Options {
    std::string controller;               // The controller's address.
    HostId host;                          // Which host of the cluster spec this worker serves.
    std::string listen = "127.0.0.1:0";  // Or "inproc:NAME" (tests: rpc/in_process.h).
    // The bulk stream's port (large shards to peers on other machines), on listen's host; 0: a
    // free one (peers learn it with each shard).
    int bulk_port = 0;
    rpc::ChannelOptions channel;  // token: the cluster token (required; ControllerServer's).
    // Listening off loopback needs TLS (channel.tls: mutual with the controller and peers,
    // bulk stream included) unless this is set (--insecure).
    bool insecure = false;
    std::string pjrt_plugin = pjrt::DefaultCpuPluginPath();
    absl::Duration controller_lost_timeout = absl::Seconds(10);
    // This worker's machine: peers reporting the same one exchange shards through shared memory,
    // others through TCP streams. Empty: the host name.
    std::string machine;
    // How long one collective waits for another worker process before it fails.
    absl::Duration collective_timeout = absl::Minutes(5);
    // A device still running a computation of a cancelled run (a timeout, an admin, a client
    // gone) this long after the cancellation cannot be freed in this process: the worker stops
    // with restart_requested() (the `pw worker` command then starts afresh in place). Zero: no
    // watchdog.
    absl::Duration overrun_grace = absl::Seconds(5);
    // Where to serve Prometheus metrics ("host:port", port 0: a free one); empty: nowhere.
    std::string metrics_listen;
  };
  // Fetches the cluster spec, starts serving, registers with the controller.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(Options options);
  ~WorkerServer() override;

  const std::string& address() const { return address_; }
  HostId host() const { return options_.host; }
  // Serves large shards to peers on other machines (none on an in-process name: do not call).
  const dataplane::BulkServer& bulk() const { return *bulk_; }
  // This process's shared-memory mailbox (RegisterWorkerRequest.data_address).
  const std::string& mailbox_name() const { return mailbox_->name(); }
  // Blocks until Stop(), the controller has been unreachable too long, or it no longer counts
  // this worker as live (it declared the host failed, or it restarted): then this worker's state
  // is stale, and it must start afresh as a new process (its cluster manager restarts it).
  // Returns OK after Stop(), else why the worker stopped.
  absl::Status WaitForStop();
  void Stop(const absl::Status& why = absl::OkStatus());
  // Whether the worker stopped because a device overran a cancelled run: its device threads may
  // never return, so the process must be replaced (exec) rather than torn down.
  bool restart_requested() const;
  // Checks the devices once (the heartbeat loop calls it); true if it asked for a restart.
  bool CheckOverruns(absl::Time now);
  // The membership the controller pushed (its command stream): where each live peer is. A
  // table older than the one held is ignored; a peer that left or moved has its stub and
  // mailbox dropped.
  void SetHosts(const ::pathways::v1::HostTable& table);
  // Where the host table says `host`'s worker is ("" if it does not list it).
  std::string PeerAddress(HostId host) const;

  // --- CollectivePeers.
  bool IsLocal(DeviceId device) const override;
  void Send(const CollectiveKey& key, absl::Span<const DeviceId> devices, std::vector<int> ranks,
            std::vector<std::string> inputs) override;
  void SendFailure(int64_t run, int32_t node, absl::Span<const DeviceId> devices,
                   const absl::Status& reason) override;
  bool Poll() override { return mailbox_ != nullptr && mailbox_->Poll(); }
  Processes ProcessesOf(absl::Span<const DeviceId> devices) const override;
  void SendPiece(const CollectiveKey& key, absl::Span<const DeviceId> devices, int phase, int to,
                 int from, size_t offset, std::string bytes) override;

 private:
  explicit WorkerServer(Options options);
  absl::Status Register();
  void HeartbeatLoop();
  // The worker of `host`: this one, or a stub for a peer made from the host table (null if the
  // table does not list it: not a live member). Never waits on the network.
  WorkerInterface* Peer(HostId host);
  rpc::RemoteWorker* RemotePeer(HostId host);
  // Forgets a peer's stub after an error, so the next use makes it again from the table.
  void ForgetPeer(HostId host, rpc::RemoteWorker* stale);
  // Sends a contribution to host `h`: through its mailbox if it shares this machine, else RPC.
  void SendTo(HostId h, const ::pathways::v1::CollectiveContribution& c,
              std::function<void(const absl::Status&)> on_error);
  // The hosts holding `devices`, in order of the first rank each holds.
  std::vector<HostId> ProcessHosts(absl::Span<const DeviceId> devices) const;
  // The hosts holding non-local `devices`.
  std::vector<HostId> RemoteHosts(absl::Span<const DeviceId> devices) const;
  grpc::ClientContext* Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;
  // A peer's collective contribution, by mailbox or RPC: delivered to collectives_, its inputs
  // counted as received over ICI or DCN (by the sender's island).
  absl::Status ReceiveCollective(const ::pathways::v1::CollectiveContribution& c);
  // A message in our mailbox (a PeerMail), or by the Mail RPC: a collective contribution, a
  // peer's fetches (answered by mail), or a peer's answers to fetches one of our stubs sent it
  // (handed to that stub).
  void ReceiveMail(absl::string_view message);
  void ReceivePeerMail(const ::pathways::v1::PeerMail& mail);
  // Answers to a peer's mailed fetches: to its mailbox (counted), else by the Mail RPC.
  void AnswerMailedFetches(const rpc::WorkerService::ReplyTo& reply,
                           const std::vector<::pathways::v1::CommandEvent>& events);
  // The mailbox `name` of peer `host` (on this machine), opened on first use; null if gone.
  std::shared_ptr<dataplane::ShmMailbox> ReplyMailbox(HostId host, const std::string& name);
  // WorkerService's Mailer: answers to a peer's fetches, to the stub and mailbox `reply`
  // names; false where the mailbox is gone or full.
  bool MailEvents(const rpc::WorkerService::ReplyTo& reply,
                  const std::vector<::pathways::v1::CommandEvent>& events);

  const Options options_;
  std::string machine_;
  ClusterSpec spec_;
  std::unique_ptr<::pathways::v1::Controller::Stub> controller_;
  uint64_t controller_generation_ = 0;  // Its channel's server, in process (rpc/in_process.h).
  Collectives collectives_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<dataplane::BulkServer> bulk_;  // Before service_, which uses it.
  std::unique_ptr<rpc::WorkerService> service_;
  rpc::Serving serving_;
  std::unique_ptr<metrics::MetricsServer> metrics_;  // Reads worker_.
  std::string address_;
  absl::Duration heartbeat_interval_ = absl::Milliseconds(200);

  mutable pw::Mutex mu_;
  absl::flat_hash_map<HostId, rpc::RemoteWorker*> peers_ ABSL_GUARDED_BY(mu_);
  // Peers on this machine: their shared-memory mailboxes (collective inputs).
  absl::flat_hash_map<HostId, std::shared_ptr<dataplane::ShmMailbox>> mailboxes_
      ABSL_GUARDED_BY(mu_);
  std::unique_ptr<dataplane::ShmMailbox> mailbox_;  // Ours.
  // What answers to mailed fetches reach this server through; closed (null) when it stops.
  struct MailGate {
    explicit MailGate(WorkerServer* s) : server(s) {}
    pw::Mutex mu;
    WorkerServer* server ABSL_GUARDED_BY(mu);
  };
  const std::shared_ptr<MailGate> mail_gate_ = std::make_shared<MailGate>(this);
  std::vector<std::unique_ptr<rpc::RemoteWorker>> stubs_ ABSL_GUARDED_BY(mu_);  // Never freed early.
  // Peers' mailboxes that answers to their fetches go to (by the name each fetch gives).
  absl::flat_hash_map<HostId, std::shared_ptr<dataplane::ShmMailbox>> reply_mailboxes_
      ABSL_GUARDED_BY(mu_);
  // The same stubs by RemoteWorker::mail_id(): where mailed answers go.
  absl::flat_hash_map<uint64_t, rpc::RemoteWorker*> stubs_by_mail_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<HostId, ::pathways::v1::HostAddress> hosts_ ABSL_GUARDED_BY(mu_);
  int64_t hosts_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stop_reason_ ABSL_GUARDED_BY(mu_);
  bool restart_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;
};

}  // namespace pw::server
