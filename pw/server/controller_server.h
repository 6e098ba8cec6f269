// ControllerServer: the `pw controller` process. The Controller (resource manager, one gang
// scheduler per island, programs, buffers) served over gRPC, and the cluster's membership:
// workers register (one per host of the cluster spec), send heartbeats, and are declared failed
// when they miss them or their command stream breaks. A failed host's outstanding work fails
// naming it, its devices leave the resource manager, and every worker aborts collectives that
// include them; when its worker registers again, the devices return.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "pw/base/mutex.h"
#include "pw/base/work_queue.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/dataplane/shm_mailbox.h"
#include "pw/controller/controller.h"
#include "pw/metrics/metrics.h"
#include "pw/rpc/auth.h"
#include "pw/rpc/controller_service.h"
#include "pw/rpc/remote_worker.h"

namespace pw::server {

class ControllerServer final : public rpc::ClusterMembership {
 public:
  // How long a stopping controller lets calls in flight end before gRPC cancels them.
  static constexpr absl::Duration kShutdownGrace = absl::Milliseconds(250);
  struct Options {
    // Port 0: any free port (see address()); "inproc:NAME": no socket (tests: rpc/in_process.h).
    std::string listen = "127.0.0.1:0";
    rpc::ChannelOptions channel;          // Client token, message limit, TLS (to clients and workers).
    // Listening off loopback needs TLS (channel.tls) unless this is set (--insecure).
    bool insecure = false;
    // Shared with the workers only (see pw/rpc/auth.h). Empty: a random one (cluster_token()).
    std::string cluster_token;
    absl::Duration heartbeat_interval = absl::Milliseconds(200);
    // A worker silent this long is failed; its futures fail within about this time.
    absl::Duration failure_timeout = absl::Seconds(5);
    rpc::ClientLimits clients;  // Max clients; grace before a client without a Session goes.
    // The timeout of runs submitted without one (zero: none; pw controller --run-timeout-ms).
    absl::Duration default_run_timeout = absl::ZeroDuration();
    int64_t max_program_nodes = Controller::Options().max_program_nodes;  // Controller::Options.
    Controller::Options::Definitions definitions;  // What one client may have registered.
    int64_t max_client_bytes = 0;  // Controller::Options: each client's quota of array bytes.
    std::string checkpoint_root;   // Controller::Options (pw controller --checkpoint-root).
    Controller::Options::Scheduling scheduling;  // The islands' gang scheduling policy, window.
    // Where to serve Prometheus metrics ("host:port", port 0: a free one); empty: nowhere.
    std::string metrics_listen;
    // How long a worker's deletes wait for a command to travel with (RemoteWorker::kLazyFlush).
    absl::Duration lazy_command_flush = rpc::RemoteWorker::kLazyFlush;
    // Commands to workers on this machine go through their shared-memory mailboxes, events
    // come back through the controller's (RemoteWorker::MailCommands); else all on the streams.
    bool mail_commands = true;
    // Clients on this machine mail their session's batches to the controller's mailbox and take
    // their runs' events in theirs (rpc::ClientSession); else all on their Session streams.
    bool mail_sessions = true;
  };
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(const ClusterSpec& spec,
                                                                 Options options);
  // Stops serving, fails what is outstanding, stops the controller.
  ~ControllerServer() override;

  // The address clients and workers dial ("127.0.0.1:port", or the in-process name).
  const std::string& address() const { return address_; }
  // Where its metrics are served ("host:port"), or empty.
  std::string metrics_address() const;
  // What workers must present (WorkerServer::Options::channel.token).
  const std::string& cluster_token() const { return options_.cluster_token; }
  Controller& controller() { return *controller_; }
  // Commands mailed to workers on this machine (Options::mail_commands), all stubs together.
  int64_t commands_mailed() const;
  rpc::ControllerService& service() { return *service_; }
  // Blocks until Shutdown() (an RPC from `pw down`, or a signal handler's call).
  void WaitForShutdown();
  // Hosts whose worker is registered and alive.
  int alive_hosts() const;
  // Declares `host` failed now (as missed heartbeats would).
  // With `observed`: only if that is still the host's worker (it may have rejoined since).
  void FailHost(HostId host, const std::string& reason, rpc::RemoteWorker* observed = nullptr);

  // --- rpc::ClusterMembership.
  absl::StatusOr<::pathways::v1::RegisterWorkerResponse> RegisterWorker(
      const ::pathways::v1::RegisterWorkerRequest& req) override;
  absl::Status Heartbeat(HostId host) override;
  void AddMembers(::pathways::v1::ClusterStatus* out) override;
  std::string ClusterSpecJson() override { return spec_.ToJson(); }
  absl::StatusOr<std::vector<RunId>> Cancel(const ::pathways::v1::CancelRequest& req) override;
  void Shutdown() override;

 private:
  struct Member {
    std::string address, data_address, machine, metrics_address;
    rpc::RemoteWorker* worker = nullptr;  // Owned by workers_.
    bool listed = false;  // In the host table: registered, not failed.
    absl::Time last_heartbeat;
    bool alive = false;
    bool failing = false;  // FailHost is taking it out of service.
    std::string reason;    // Why not alive.
  };
  ControllerServer(const ClusterSpec& spec, Options options);
  void MonitorLoop();
  // A message in the controller's mailbox: events a worker on this machine mailed.
  void ReceiveMail(absl::string_view message);
  // Pushes the host table (every listed member) to every listed member's worker, under a new
  // version (RemoteWorker::SetHosts: ordered on each command stream before later work).
  void PushHostsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts every live worker process's trace recorder, or stops them and gathers their events
  // (on this process's clock; a worker that cannot be asked is left out, logged).
  trace::Chunk TraceWorkers(bool start);

  const ClusterSpec spec_;
  const Options options_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<rpc::ControllerService> service_;
  std::unique_ptr<metrics::MetricsServer> metrics_;  // Stopped first: it reads the controller.
  rpc::Serving serving_;
  std::string address_;

  mutable pw::Mutex mu_;
  absl::flat_hash_map<HostId, Member> members_ ABSL_GUARDED_BY(mu_);
  // Every stub ever made, kept until the controller is gone: the controller and in-flight work
  // hold raw pointers to them, and a rejoined host gets a new one.
  std::vector<std::unique_ptr<rpc::RemoteWorker>> workers_ ABSL_GUARDED_BY(mu_);
  // Events that workers on this machine mail (Options::mail_commands; null if it could not be
  // made), handed to the stub they name: workers_ by RemoteWorker::mail_id (its own lock, taken
  // alone: the receiver thread must not wait on mu_); and clients' session batches
  // (Options::mail_sessions), handed to the service.
  std::unique_ptr<dataplane::ShmMailbox> mailbox_;
  pw::Mutex mail_mu_;
  absl::flat_hash_map<uint64_t, rpc::RemoteWorker*> stubs_by_mail_id_ ABSL_GUARDED_BY(mail_mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int64_t hosts_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread monitor_;
  std::unique_ptr<WorkQueue> trace_queue_;  // Gathers the workers' traces (TraceWorkers(false)).
};

}  // namespace pw::server
