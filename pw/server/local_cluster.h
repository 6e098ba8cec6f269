// Local clusters: `pw up` starts a controller and one worker per host as processes of the `pw`
// binary on this machine; `pw down` stops them; client commands find the most recent one.
//
// The state of the most recent cluster lives in $PW_STATE_DIR (default
// $HOME/.local/state/pathways): cluster.json (address, pids), the spec, and one log per process.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/rpc/auth.h"

namespace pw::server {

struct LocalClusterState {
  std::string address;  // The controller's.
  int controller_pid = 0;
  std::vector<int> worker_pids;
  // How each worker was started (its argv), for the supervisor to start it again.
  std::vector<std::vector<std::string>> worker_argv;
  int supervisor_pid = 0;  // pw up --restart-workers: the process that restarts them; 0: none.
  // Each worker's CPU list (pw worker --cpus); "" if unbound.
  std::vector<std::string> worker_cpus;
  std::string cluster_token;  // The processes' (pw down presents it to shut the controller down).
  std::string state_dir;
  dataplane::TlsFiles tls;  // The processes' certificate files (absolute paths), if they serve TLS.
};

// A channel to the cluster `s` with `token`, over its TLS if it serves TLS (files that can no
// longer be read: none, so the dial names the failure).
rpc::ChannelOptions ChannelTo(const LocalClusterState& s, std::string token);

struct LaunchOptions {
  std::string pw_binary;   // Path of the `pw` executable to run.
  std::string token;       // Passed to every process through PW_TOKEN.
  int64_t failure_timeout_ms = 5000;
  // Passed to every worker (pw worker --collective-timeout-ms; 0: its default).
  int64_t collective_timeout_ms = 0;
  // Passed to the controller (--run-timeout-ms; 0: none) and the workers (--overrun-grace-ms;
  // -1: their default).
  int64_t run_timeout_ms = 0;
  int64_t max_client_bytes = 0;  // The controller's --max-client-bytes (0: no quota).
  // The controller's --checkpoint-root (made if missing); empty: <state dir>/checkpoints.
  std::string checkpoint_root;
  std::string scheduling = "share";  // The controller's --scheduling and --scheduling-window-ms.
  double scheduling_window_ms = 2;
  int64_t overrun_grace_ms = -1;
  // Certificate files every process serves and dials with (pw up --tls-cert/--tls-key/--tls-ca).
  dataplane::TlsFiles tls;
  // Give each host's worker its own share of the CPUs this process may use (SplitCpus).
  bool bind_cpus = true;
  absl::Duration ready_timeout = absl::Seconds(60);
  // Start a supervisor (`pw supervise`) that restarts workers that exit (pw up --restart-workers).
  bool restart_workers = false;
};

// $PW_STATE_DIR, or $HOME/.local/state/pathways; created if missing.
absl::StatusOr<std::string> StateDir();
absl::StatusOr<LocalClusterState> LoadState();

// Starts the processes (each in its own session, so they outlive the caller) and waits until
// every host's worker has registered. Records the state; on failure stops what it started.
absl::StatusOr<LocalClusterState> LaunchLocalCluster(const ClusterSpec& spec,
                                                     const LaunchOptions& options);
// Asks the controller to shut down, stops the workers (SIGTERM, then SIGKILL after `grace`),
// removes the shared-memory segments of processes that are gone, and forgets the state.
absl::Status StopLocalCluster(const LocalClusterState& state, absl::Duration grace = absl::Seconds(5));

// The supervisor of a cluster started with LaunchOptions::restart_workers (`pw supervise`):
// every `poll`, a worker of the state in `state_dir` whose process is gone is started again with
// its argv (it rejoins the cluster as its host) and the state records its new pid; at most
// kMaxRestarts per host within kRestartWindow (then that host is left down, logged). Returns
// when the cluster is gone (its controller exited, or pw down removed the state) or the state
// names another supervisor (it waits up to 30 s for the state to name it first). Logs to stderr.
inline constexpr int kMaxRestarts = 5;
inline constexpr absl::Duration kRestartWindow = absl::Minutes(1);
absl::Status SuperviseWorkers(const std::string& state_dir,
                              absl::Duration poll = absl::Milliseconds(100));

// The cluster a client command should use: `flag`, else $PW_CLUSTER, else the most recent
// `pw up` cluster. Empty (no error) when there is none: use an embedded cluster.
std::string ClusterAddress(const std::string& flag);

// Whether process `pid` is alive (not a zombie).
bool ProcessAlive(int pid);
// Whether `pid` is alive and still the controller, a worker or the supervisor of cluster `s` (by
// its command line), not another process that reused the pid.
bool IsClusterProcess(int pid, const LocalClusterState& s);
// Starts `argv` in a new session with stdout/stderr appended to `log`; returns its pid.
absl::StatusOr<int> SpawnDetached(const std::vector<std::string>& argv, const std::string& log);

}  // namespace pw::server
