// The cluster subcommands of `pw`: up, status, down, cancel (an admin's), and the server
// processes (controller, worker) that `pw up` starts.
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "pw/rpc/remote_controller.h"
#include "pw/server/controller_server.h"
#include "pw/server/worker_server.h"

namespace pw::cli {

// The cluster at `address` as its admin (every tenant's spans, the controller's peak memory)
// where the cluster token is at hand (the cluster pw up started here, or $PW_CLUSTER_TOKEN),
// else as a client ($PW_TOKEN); `*admin` says which.
absl::StatusOr<std::unique_ptr<rpc::RemoteController>> DialAsAdminIfPossible(
    const std::string& address, bool* admin);

class ClusterCommands {
 public:
  // Adds the subcommands to `app`.
  explicit ClusterCommands(CLI::App* app);
  bool parsed() const;
  // Runs the parsed subcommand; `argv0` is this binary (pw up runs it for the processes).
  int Run(const char* argv0);

 private:
  int Up(const char* argv0);
  int Status();
  int Down();
  int Cancel();
  int TraceCluster();
  int Dashboard();
  int Controller();
  int Worker();
  int Supervise();
  int Tenant();
  // --scheduling, --scheduling-window-ms.
  void AddSchedulingFlags(CLI::App* command);
  // --tls-cert, --tls-key, --tls-ca (and --insecure where the command can listen off loopback).
  void AddTlsFlags(CLI::App* command, bool insecure);

  CLI::App *up_, *status_, *down_, *cancel_, *trace_, *dashboard_, *controller_, *worker_;
  CLI::App* supervise_;
  std::string supervise_state_dir_;
  bool restart_workers_ = false;
  CLI::App *tenant_, *tenant_set_, *tenant_list_;
  // pw dashboard.
  int dashboard_port_ = 0;
  bool dashboard_detach_ = false;
  // pw trace.
  double trace_seconds_ = 2;
  std::string trace_out_ = "trace.json";
  std::string trace_plot_;
  // pw cancel.
  int64_t cancel_run_ = -1;
  int64_t cancel_client_ = -1;
  std::string cancel_reason_;
  // pw up / pw controller.
  std::string config_;
  int islands_ = 2, hosts_per_island_ = 2, devices_per_host_ = 2;
  bool detach_ = false;
  std::string cpu_bind_ = "host";
  // pw status.
  bool json_ = false;
  std::string cluster_;
  // pw controller / pw worker.
  std::string listen_ = "127.0.0.1:0";
  int bulk_port_ = 0;
  std::string address_file_;
  std::string token_;
  std::string cluster_token_;
  std::string tls_cert_, tls_key_, tls_ca_, tls_server_name_;  // --tls-*.
  bool insecure_ = false;
  int64_t max_program_nodes_ = int64_t{1} << 20;
  Controller::Options::Definitions definitions_;  // --max-client-functions and the like.
  int64_t failure_timeout_ms_ = 5000;
  int64_t max_clients_ = 1024;
  int64_t session_grace_ms_ = 30000;
  int64_t collective_timeout_ms_ = 0;
  int64_t run_timeout_ms_ = 0;
  int64_t max_client_bytes_ = 0;
  std::string checkpoint_root_;
  std::string scheduling_ = "share";
  double scheduling_window_ms_ = 2;
  // pw tenant.
  std::string tenant_name_;
  double tenant_share_ = 0;
  int64_t tenant_memory_ = -1;
  int metrics_port_ = -1;  // -1: no metrics endpoint.
  int64_t overrun_grace_ms_ = -1;  // -1: the worker's default.
  std::string controller_address_;
  int64_t host_ = -1;
  std::string machine_;
  std::string cpus_;
};

}  // namespace pw::cli
