#include "pw/cli/cluster_commands.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "pw/cli/plot.h"
#include "pw/client/client.h"
#include "pw/dashboard/dashboard.h"
#include "pw/dataplane/shm_arena.h"
#include "pw/rpc/remote_controller.h"
#include "pw/server/cpu_binding.h"
#include "pw/server/local_cluster.h"
#include "pw/server/status_json.h"
#include "pw/trace/trace_json.h"

namespace pw::cli {
namespace {

constexpr char kFailureTimeoutHelp[] =
    "A worker silent this long is declared failed (one whose process dies: at once)";
constexpr char kCollectiveTimeoutHelp[] =
    "How long a collective waits for another worker process before it fails (default 300000)";

constexpr char kRunTimeoutHelp[] =
    "A run not finished this long after it was submitted is cancelled and its client gets "
    "DEADLINE_EXCEEDED (default 0: runs have only the timeouts their clients give)";
constexpr char kMaxClientBytesHelp[] =
    "The most bytes of arrays (every shard and replica) one client may hold on the cluster at "
    "once; a put or run past it fails with RESOURCE_EXHAUSTED (default 0: no quota)";
constexpr char kOverrunGraceHelp[] =
    "A worker whose device still runs a cancelled run's computation this long after the "
    "cancellation restarts in place, so the device serves again (default 5000; 0: never)";

// Replaces this process with a fresh run of the same command line (same pid).
void RestartInPlace() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t start = 0; start < cmdline.size();) {
    size_t end = cmdline.find('\0', start);
    if (end == std::string::npos) end = cmdline.size();
    args.push_back(cmdline.substr(start, end - start));
    start = end + 1;
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "pw: could not restart: %s\n", std::strerror(errno));
}

constexpr char kMetricsPortHelp[] =
    "Serve Prometheus metrics at http://HOST:PORT/metrics, HOST that of --listen (0: a free "
    "port; pw status --json lists it); default: none";

// The metrics endpoint's "host:port" for --listen and --metrics-port, or "" for none.
std::string MetricsListen(const std::string& listen, int port) {
  if (port < 0) return "";
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pw: %s\n", s.ToString().c_str());
  return 1;
}

// `flag`, else the environment variable `env`, else "".
std::string Token(const std::string& flag, const char* env = "PW_TOKEN") {
  if (!flag.empty()) return flag;
  const char* t = std::getenv(env);
  return t == nullptr ? "" : t;
}

// Runs `on_signal` on a thread of its own when SIGINT or SIGTERM arrives (whichever thread the
// kernel delivers it to: the handler only writes to a pipe).
int stop_pipe[2] = {-1, -1};
void OnStopSignal(std::function<void()> on_signal) {
  if (pipe2(stop_pipe, O_CLOEXEC) != 0) return;
  struct sigaction sa = {};
  sa.sa_handler = [](int sig) {
    char c = static_cast<char>(sig);
    (void)!write(stop_pipe[1], &c, 1);
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::thread([on_signal = std::move(on_signal)] {
    char c;
    while (read(stop_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    on_signal();
  }).detach();
}

absl::StatusOr<ClusterSpec> SpecFrom(const std::string& config, int islands, int hosts, int devices) {
  return config.empty() ? ClusterSpec::Uniform(islands, hosts, devices)
                        : ClusterSpec::FromFile(config);
}

std::string Bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return absl::StrFormat("%.1f GiB", b / double(int64_t{1} << 30));
  if (b >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / double(int64_t{1} << 20));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

// The tenants, their shares (* : an admin's) and what each achieved over the last second.
void PrintTenants(const ::pathways::v1::ClusterStatus& st) {
  std::printf("tenants (%s scheduling; * set by the admin):\n", st.scheduling().c_str());
  std::printf("  %-40s %7s %9s %7s %7s %s\n", "tenant", "share", "achieved", "queued", "clients",
              "memory (quota)");
  for (const auto& t : st.tenants()) {
    const std::string quota =
        t.memory_quota_bytes() > 0 ? absl::StrCat(" (", Bytes(t.memory_quota_bytes()), ")") : "";
    std::printf("  %-40s %6.3g%s %8.1f%% %7lld %7d %s%s\n", t.name().c_str(), t.share(),
                t.pinned() ? "*" : " ", 100 * t.achieved_share(), (long long)t.queued(),
                t.clients(), Bytes(t.memory_bytes()).c_str(), quota.c_str());
  }
}


constexpr char kTlsCertHelp[] =
    "This process's TLS certificate (PEM; scripts/tls-certs.sh makes a cluster's); with "
    "--tls-key and --tls-ca, every connection of the cluster is TLS, mutual between its processes";
constexpr char kTlsKeyHelp[] = "The certificate's private key (PEM)";
constexpr char kTlsCaHelp[] =
    "The CA that signs the cluster's certificates (PEM); clients set PW_TLS_CA to it";
constexpr char kInsecureHelp[] =
    "Allow listening off loopback without TLS (plaintext; only on a network you trust)";

}  // namespace

void ClusterCommands::AddSchedulingFlags(CLI::App* command) {
  command->add_option("--scheduling", scheduling_,
                      "Each island's gang scheduling: share (tenants get device time in "
                      "proportion to their shares; the default) or fifo (in arrival order)")
      ->check(CLI::IsMember({"share", "fifo"}));
  command->add_option("--scheduling-window-ms", scheduling_window_ms_,
                      "Estimated device time each island keeps in flight per device (default "
                      "2), beyond what covers its measured round trip to the hosts: the "
                      "scheduler decides what runs next at about this granularity")
      ->check(CLI::Range(0.001, 10000.0));
}

void ClusterCommands::AddTlsFlags(CLI::App* command, bool insecure) {
  command->add_option("--tls-cert", tls_cert_, kTlsCertHelp);
  command->add_option("--tls-key", tls_key_, kTlsKeyHelp);
  command->add_option("--tls-ca", tls_ca_, kTlsCaHelp);
  command->add_option("--tls-server-name", tls_server_name_,
                      "The name every server's certificate carries, checked instead of the "
                      "address dialled (one name for a cluster whose addresses are not known "
                      "ahead, e.g. pods); clients set PW_TLS_SERVER_NAME to it");
  if (insecure) command->add_flag("--insecure", insecure_, kInsecureHelp);
}

ClusterCommands::ClusterCommands(CLI::App* app) {
  up_ = app->add_subcommand("up", "Start a local cluster: a controller and one worker process per "
                                  "host; prints its address last");
  up_->add_option("--config", config_, "Cluster spec (JSON)");
  up_->add_option("--islands", islands_, "Islands");
  up_->add_option("--hosts-per-island", hosts_per_island_, "Hosts per island");
  up_->add_option("--devices-per-host", devices_per_host_, "Devices per host");
  up_->add_flag("--detach", detach_, "Return once the cluster is ready (pw down stops it)");
  up_->add_option("--cpu-bind", cpu_bind_,
                  "host: each host's worker gets its own share of this machine's CPUs (hosts "
                  "share CPUs only when there are fewer CPUs than hosts); none: unbound")
      ->check(CLI::IsMember({"host", "none"}));
  up_->add_option("--token", token_, "Shared token the processes require (default $PW_TOKEN)");
  up_->add_option("--failure-timeout-ms", failure_timeout_ms_,
                  kFailureTimeoutHelp);
  up_->add_option("--collective-timeout-ms", collective_timeout_ms_, kCollectiveTimeoutHelp);
  up_->add_option("--run-timeout-ms", run_timeout_ms_, kRunTimeoutHelp);
  up_->add_option("--overrun-grace-ms", overrun_grace_ms_, kOverrunGraceHelp);
  up_->add_option("--max-client-bytes", max_client_bytes_, kMaxClientBytesHelp);
  up_->add_flag("--restart-workers", restart_workers_,
                "Restart a worker whose process exits (it rejoins as its host; at most 5 times a "
                "minute per host). Under Kubernetes or Slurm the cluster manager does this");
  up_->add_option("--checkpoint-root", checkpoint_root_,
                  "The directory clients' checkpoints are written under (pw.checkpoint; default "
                  "<state dir>/checkpoints)");
  AddSchedulingFlags(up_);
  AddTlsFlags(up_, /*insecure=*/false);  // pw up's processes listen on loopback.

  status_ = app->add_subcommand("status", "Show the cluster's hosts, devices, memory, queues");
  status_->add_flag("--json", json_, "Print one JSON object");
  status_->add_option("--cluster", cluster_, "Cluster address (default: $PW_CLUSTER, else the "
                                             "last `pw up` cluster)");

  down_ = app->add_subcommand("down", "Stop the cluster that `pw up` started");
  down_->add_option("--cluster", cluster_, "Its address (default: the last `pw up` cluster); "
                                           "only a cluster pw up started here can be stopped");

  cancel_ = app->add_subcommand("cancel", "Cancel a run, or every run of a client (the cluster's "
                                          "admin: needs the cluster token)");
  cancel_->add_option("run", cancel_run_, "The run (its id, as pw status lists it)");
  cancel_->add_option("--client", cancel_client_, "Cancel every run of this client instead");
  cancel_->add_option("--reason", cancel_reason_, "Told to the runs' clients");
  cancel_->add_option("--cluster", cluster_, "Cluster address (default: $PW_CLUSTER, else the "
                                             "last `pw up` cluster)");

  trace_ = app->add_subcommand(
      "trace", "Record a timeline of the cluster (every process's spans, pw/trace) as Chrome "
               "trace JSON for the Perfetto UI; every tenant's in full with the cluster token "
               "(where pw up ran, or $PW_CLUSTER_TOKEN), else others' anonymous");
  trace_->add_option("--cluster", cluster_, "Cluster address (default: $PW_CLUSTER, else the "
                                            "last `pw up` cluster)");
  trace_->add_option("--seconds", trace_seconds_, "How long to record (default 2)")
      ->check(CLI::Range(0.0, 3600.0));
  trace_->add_option("--out", trace_out_, "Where to write the trace (default trace.json)");
  trace_->add_option("--plot", trace_plot_,
                     "Also draw a device x time chart (as the paper's Fig. 9) to this PNG");

  tenant_ = app->add_subcommand("tenant", "Tenants' shares of device time and memory quotas");
  tenant_->require_subcommand(1);
  tenant_set_ = tenant_->add_subcommand(
      "set", "Set a tenant's share and memory quota, live (the cluster's admin: needs the "
             "cluster token, where pw up ran or $PW_CLUSTER_TOKEN); its clients' own requests "
             "no longer change them");
  tenant_set_->add_option("name", tenant_name_, "The tenant")->required();
  tenant_set_->add_option("--share", tenant_share_, "Its share of each island's device time")
      ->check(CLI::Range(1e-3, 1e6));
  tenant_set_->add_option("--memory", tenant_memory_,
                          "Bytes of arrays its clients may hold together (0: no quota)")
      ->check(CLI::NonNegativeNumber);
  tenant_list_ = tenant_->add_subcommand(
      "list", "Each tenant's share, the device time it achieved over the last second, its "
              "queue and memory");
  tenant_list_->add_flag("--json", json_, "Print one JSON array");
  for (CLI::App* c : {tenant_set_, tenant_list_})
    c->add_option("--cluster", cluster_, "Cluster address (default: $PW_CLUSTER, else the "
                                         "last `pw up` cluster)");

  dashboard_ = app->add_subcommand(
      "dashboard", "Serve a live web view of the cluster (islands, hosts, devices, queues, "
                   "memory, links, programs by tenant, a rolling timeline); prints its URL last");
  dashboard_->add_option("--cluster", cluster_, "Cluster address (default: $PW_CLUSTER, else the "
                                                "last `pw up` cluster)");
  dashboard_->add_option("--port", dashboard_port_, "Port on 127.0.0.1 (default 0: a free one)")
      ->check(CLI::Range(0, 65535));
  dashboard_->add_flag("--detach", dashboard_detach_,
                       "Return once it serves (it runs on until killed or the cluster goes)");

  controller_ = app->add_subcommand("controller", "Run the controller process");
  controller_->add_option("--config", config_, "Cluster spec (JSON)");
  controller_->add_option("--islands", islands_, "Islands");
  controller_->add_option("--hosts-per-island", hosts_per_island_, "Hosts per island");
  controller_->add_option("--devices-per-host", devices_per_host_, "Devices per host");
  controller_->add_option("--listen", listen_, "host:port to serve on (port 0: any)");
  controller_->add_option("--address-file", address_file_, "Write the bound address here");
  controller_->add_option("--token", token_, "Token clients must present (default $PW_TOKEN)");
  controller_->add_option("--cluster-token", cluster_token_,
                          "Token shared with the workers only (default $PW_CLUSTER_TOKEN; "
                          "prefer the variable: flags show in ps)");
  controller_->add_option("--failure-timeout-ms", failure_timeout_ms_,
                          kFailureTimeoutHelp);
  controller_->add_option("--run-timeout-ms", run_timeout_ms_, kRunTimeoutHelp);
  controller_->add_option("--max-clients", max_clients_,
                          "Clients connected at once; one more is refused (default 1024)");
  controller_->add_option("--session-grace-ms", session_grace_ms_,
                          "A client that has not opened its session this long after connecting "
                          "is disconnected and what it allocated released (default 30000)");
  controller_->add_option("--max-program-nodes", max_program_nodes_,
                          "The most nodes a program may have; a larger one is refused (default "
                          "1048576)");
  controller_->add_option("--max-client-bytes", max_client_bytes_, kMaxClientBytesHelp);
  controller_->add_option("--max-client-functions", definitions_.max_functions,
                          "The most functions one client may have registered at once; one more "
                          "is refused (default 16384)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  controller_->add_option("--max-client-function-bytes", definitions_.max_function_bytes,
                          "The most bytes of definitions (modules, native ops) one client's "
                          "registered functions may hold (default 1073741824)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  controller_->add_option("--max-client-programs", definitions_.max_programs,
                          "The most programs one client may have registered at once (default "
                          "16384)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  controller_->add_option("--checkpoint-root", checkpoint_root_,
                          "The directory (on a filesystem every worker shares) clients' "
                          "checkpoints are written under; none: checkpoints are refused");
  controller_->add_option("--metrics-port", metrics_port_, kMetricsPortHelp);
  AddSchedulingFlags(controller_);
  AddTlsFlags(controller_, /*insecure=*/true);

  worker_ = app->add_subcommand("worker", "Run one host's worker process");
  worker_->add_option("--controller", controller_address_, "The controller's address")->required();
  worker_->add_option("--host", host_, "Which host of the cluster spec")->required();
  worker_->add_option("--listen", listen_, "host:port to serve on (port 0: any)");
  worker_->add_option("--bulk-port", bulk_port_,
                      "Port of the bulk stream (large shards to peers on other machines), on "
                      "--listen's host (default 0: any free one)");
  worker_->add_option("--cluster-token", cluster_token_,
                      "The controller's cluster token (default $PW_CLUSTER_TOKEN)");
  worker_->add_option("--machine", machine_, "This machine's name (default: the host name); "
                                             "workers on one machine share memory");
  worker_->add_option("--cpus", cpus_, "Run on these CPUs only, e.g. 0-3,8 (default: any)");
  worker_->add_option("--collective-timeout-ms", collective_timeout_ms_, kCollectiveTimeoutHelp);
  worker_->add_option("--overrun-grace-ms", overrun_grace_ms_, kOverrunGraceHelp);
  worker_->add_option("--metrics-port", metrics_port_, kMetricsPortHelp);
  AddTlsFlags(worker_, /*insecure=*/true);

  supervise_ = app->add_subcommand("supervise", "Restart a pw up cluster's workers that exit "
                                                "(pw up --restart-workers starts it)");
  supervise_->group("");  // Hidden.
  supervise_->add_option("--state-dir", supervise_state_dir_, "pw up's state directory")
      ->required();
}

bool ClusterCommands::parsed() const {
  return up_->parsed() || status_->parsed() || down_->parsed() || cancel_->parsed() ||
         trace_->parsed() || dashboard_->parsed() || controller_->parsed() || worker_->parsed() ||
         supervise_->parsed() || tenant_->parsed();
}

int ClusterCommands::Run(const char* argv0) {
  if (up_->parsed()) return Up(argv0);
  if (status_->parsed()) return Status();
  if (down_->parsed()) return Down();
  if (cancel_->parsed()) return Cancel();
  if (trace_->parsed()) return TraceCluster();
  if (dashboard_->parsed()) return Dashboard();
  if (controller_->parsed()) return Controller();
  if (worker_->parsed()) return Worker();
  if (supervise_->parsed()) return Supervise();
  if (tenant_->parsed()) return Tenant();
  return 1;
}

int ClusterCommands::Up(const char* argv0) {
  auto spec = SpecFrom(config_, islands_, hosts_per_island_, devices_per_host_);
  if (!spec.ok()) return Fail(spec.status());
  char self[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  server::LaunchOptions o;
  o.pw_binary = n > 0 ? std::string(self, n) : argv0;
  o.token = Token(token_);
  o.failure_timeout_ms = failure_timeout_ms_;
  o.collective_timeout_ms = collective_timeout_ms_;
  o.run_timeout_ms = run_timeout_ms_;
  o.max_client_bytes = max_client_bytes_;
  o.checkpoint_root = checkpoint_root_;
  o.restart_workers = restart_workers_;
  o.scheduling = scheduling_;
  o.scheduling_window_ms = scheduling_window_ms_;
  o.overrun_grace_ms = overrun_grace_ms_;
  o.tls = {tls_cert_, tls_key_, tls_ca_, tls_server_name_};
  o.bind_cpus = cpu_bind_ == "host";
  if (!detach_) {
    // Foreground: a signal brings the cluster down. Set up before any thread starts.
    OnStopSignal([] {
      if (auto s = server::LoadState(); s.ok()) (void)server::StopLocalCluster(*s);
      std::_Exit(0);
    });
  }
  auto state = server::LaunchLocalCluster(*spec, o);
  if (!state.ok()) return Fail(state.status());
  std::fprintf(stderr, "pw up: %zu islands, %zu hosts, %zu devices; logs in %s\n",
               spec->islands().size(), spec->hosts().size(), spec->devices().size(),
               state->state_dir.c_str());
  std::printf("%s\n", state->address.c_str());
  std::fflush(stdout);
  if (detach_) return 0;
  while (server::ProcessAlive(state->controller_pid)) absl::SleepFor(absl::Milliseconds(200));
  std::fprintf(stderr, "pw up: the controller exited\n");
  (void)server::StopLocalCluster(*state);
  return 1;
}

int ClusterCommands::Down() {
  auto state = server::LoadState();
  if (!state.ok()) return Fail(state.status());
  if (!cluster_.empty() && cluster_ != state->address)
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "pw down stops the cluster that pw up started on this machine, which is at ",
        state->address, ", not ", cluster_, " (stop another cluster where it was started)")));
  if (absl::Status s = server::StopLocalCluster(*state); !s.ok()) return Fail(s);
  std::fprintf(stderr, "pw down: stopped the cluster at %s\n", state->address.c_str());
  return 0;
}

int ClusterCommands::Tenant() {
  const std::string address = server::ClusterAddress(cluster_);
  if (address.empty())
    return Fail(absl::NotFoundError("no cluster: pass --cluster, set PW_CLUSTER, or run pw up"));
  bool admin = false;
  auto c = DialAsAdminIfPossible(address, &admin);
  if (!c.ok()) return Fail(c.status());
  if (tenant_set_->parsed()) {
    TenantSettings t{.name = tenant_name_};
    if (tenant_share_ > 0) t.share = tenant_share_;
    if (tenant_memory_ >= 0) t.memory_bytes = tenant_memory_;
    if (!t.share.has_value() && !t.memory_bytes.has_value())
      return Fail(absl::InvalidArgumentError("pw tenant set: give --share, --memory or both"));
    if (absl::Status s = (*c)->SetTenant(t); !s.ok()) return Fail(s);
    std::fprintf(stderr, "pw tenant: set %s\n", tenant_name_.c_str());
    return 0;
  }
  auto st = (*c)->FullStatus();
  if (!st.ok()) return Fail(st.status());
  if (json_) {
    const nlohmann::json j = nlohmann::json::parse(server::StatusJson(*st, address));
    std::printf("%s\n", j["tenants"].dump().c_str());
    return 0;
  }
  PrintTenants(*st);
  return 0;
}

int ClusterCommands::Cancel() {
  if ((cancel_run_ >= 0) == (cancel_client_ >= 0))
    return Fail(absl::InvalidArgumentError("pw cancel takes a run or --client ID, not both"));
  const std::string address = server::ClusterAddress(cluster_);
  if (address.empty())
    return Fail(absl::NotFoundError("no cluster: pass --cluster, set PW_CLUSTER, or run pw up"));
  // The admin's credential: the cluster token of the cluster pw up started here, else
  // $PW_CLUSTER_TOKEN.
  std::string token = Token("", "PW_CLUSTER_TOKEN");
  rpc::ChannelOptions channel;
  if (auto local = server::LoadState(); local.ok() && local->address == address) {
    token = local->cluster_token;
    channel = server::ChannelTo(*local, "");
  }
  channel.token = token;
  auto c = rpc::RemoteController::Dial(address, channel, absl::Seconds(5));
  if (!c.ok()) return Fail(c.status());
  auto runs = cancel_run_ >= 0 ? (*c)->CancelRun(RunId(cancel_run_), cancel_reason_)
                               : (*c)->CancelClient(ClientId(cancel_client_), cancel_reason_);
  if (!runs.ok()) return Fail(runs.status());
  std::string listed;
  for (RunId r : *runs) absl::StrAppend(&listed, listed.empty() ? "" : ", ", r.ToString());
  std::fprintf(stderr, "pw cancel: cancelled %zu run%s%s%s\n", runs->size(),
               runs->size() == 1 ? "" : "s", listed.empty() ? "" : ": ", listed.c_str());
  return 0;
}

absl::StatusOr<std::unique_ptr<rpc::RemoteController>> DialAsAdminIfPossible(
    const std::string& address, bool* admin) {
  std::string token = Token("", "PW_CLUSTER_TOKEN");
  rpc::ChannelOptions channel;
  if (auto local = server::LoadState(); local.ok() && local->address == address) {
    token = local->cluster_token;
    channel = server::ChannelTo(*local, "");
  }
  *admin = !token.empty();
  channel.token = *admin ? token : Token("");
  return rpc::RemoteController::Dial(address, channel, absl::Seconds(5));
}

int ClusterCommands::TraceCluster() {
  const std::string address = server::ClusterAddress(cluster_);
  if (address.empty())
    return Fail(absl::NotFoundError("no cluster: pass --cluster, set PW_CLUSTER, or run pw up"));
  // The admin (every tenant's spans) with the cluster token; a client (its own) without.
  bool admin = false;
  auto remote = DialAsAdminIfPossible(address, &admin);
  if (!remote.ok()) return Fail(remote.status());
  auto client = Client::Connect(remote->get(), "pw trace");
  if (!client.ok()) return Fail(client.status());
  // SIGINT or SIGTERM ends the recording early (and still writes it).
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  if (absl::Status s = (*client)->StartTrace(); !s.ok()) return Fail(s);
  std::fprintf(stderr, "pw trace: recording %s for %g s (Ctrl-C ends it sooner)\n",
               address.c_str(), trace_seconds_);
  const absl::Time until = absl::Now() + absl::Seconds(trace_seconds_);
  while (absl::Now() < until) {
    const timespec wait = absl::ToTimespec(std::min(until - absl::Now(), absl::Seconds(1)));
    if (sigtimedwait(&stop, nullptr, &wait) > 0) break;
  }
  auto chunk = (*client)->StopTrace(/*all_tenants=*/admin);
  if (!chunk.ok()) return Fail(chunk.status());
  std::ofstream out(trace_out_);
  out << trace::ToChromeJson(*chunk);
  out.close();
  if (!out.good())
    return Fail(absl::UnavailableError(absl::StrCat("could not write ", trace_out_)));
  std::fprintf(stderr, "pw trace: %zu events from %zu processes (%lld dropped) in %s\n",
               chunk->events.size(), chunk->processes.size(),
               static_cast<long long>(chunk->dropped), trace_out_.c_str());
  if (!trace_plot_.empty()) return RunPlotter({"trace", trace_out_, trace_plot_});
  return 0;
}

int ClusterCommands::Dashboard() {
  const std::string address = server::ClusterAddress(cluster_);
  if (address.empty())
    return Fail(absl::NotFoundError("no cluster: pass --cluster, set PW_CLUSTER, or run pw up"));
  // --detach: the child serves; the parent returns once the child says where (before any gRPC
  // object exists, which fork would break).
  int ready[2] = {-1, -1};
  if (dashboard_detach_) {
    if (pipe(ready) != 0) return Fail(absl::InternalError("pw dashboard: pipe failed"));
    const pid_t pid = fork();
    if (pid < 0) return Fail(absl::InternalError("pw dashboard: fork failed"));
    if (pid > 0) {
      close(ready[1]);
      std::string url;
      char c;
      while (read(ready[0], &c, 1) == 1 && c != '\n') url.push_back(c);
      close(ready[0]);
      if (url.empty())
        return Fail(absl::UnavailableError("pw dashboard: it did not start (run it without "
                                           "--detach to see why)"));
      std::fprintf(stderr, "pw dashboard: process %d serves %s (kill it to stop)\n",
                   static_cast<int>(pid), url.c_str());
      std::printf("%s\n", url.c_str());
      return 0;
    }
    close(ready[0]);
    setsid();
    // Its log: dashboard.log in the state directory (owner-only, as pw up's logs).
    std::string log = "/dev/null";
    if (auto dir = server::StateDir(); dir.ok()) log = *dir + "/dashboard.log";
    const int null = open("/dev/null", O_RDONLY);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0600);
    if (null >= 0) dup2(null, STDIN_FILENO);
    if (out >= 0) {
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
    }
    if (null >= 0) close(null);
    if (out >= 0) close(out);
  }
  signal(SIGPIPE, SIG_IGN);  // A browser that leaves mid-response must not end the server.
  bool admin = false;
  auto remote = DialAsAdminIfPossible(address, &admin);
  if (!remote.ok()) return Fail(remote.status());
  auto client = Client::Connect(remote->get(), "pw dashboard");
  if (!client.ok()) return Fail(client.status());
  rpc::RemoteController* r = remote->get();
  dashboard::Options o;
  o.listen = absl::StrCat("127.0.0.1:", dashboard_port_);
  o.status = [r, address]() -> absl::StatusOr<std::string> {
    auto st = r->FullStatus();
    if (!st.ok()) return st.status();
    return server::StatusJson(*st, address);
  };
  o.tracer = client->get();
  o.all_tenants = admin;
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // Before the servers' threads start.
  auto d = dashboard::Dashboard::Start(o);
  if (!d.ok()) return Fail(d.status());
  std::fprintf(stderr, "pw dashboard: serving %s for the cluster at %s\n", (*d)->url().c_str(),
               address.c_str());
  std::printf("%s\n", (*d)->url().c_str());
  std::fflush(stdout);
  if (ready[1] >= 0) {
    const std::string line = (*d)->url() + "\n";
    (void)!write(ready[1], line.data(), line.size());
    close(ready[1]);
  }
  // Until a signal, or the cluster has been unreachable for 10 s.
  absl::Time last_ok = absl::Now();
  while (true) {
    const timespec wait = absl::ToTimespec(absl::Seconds(2));
    if (sigtimedwait(&stop, nullptr, &wait) > 0) break;
    if (r->FullStatus().ok()) last_ok = absl::Now();
    else if (absl::Now() - last_ok > absl::Seconds(10)) {
      std::fprintf(stderr, "pw dashboard: the cluster at %s is gone; exiting\n", address.c_str());
      break;
    }
  }
  return 0;
}

int ClusterCommands::Status() {
  const std::string address = server::ClusterAddress(cluster_);
  if (address.empty())
    return Fail(absl::NotFoundError("no cluster: pass --cluster, set PW_CLUSTER, or run pw up"));
  // The cluster pw up started here: its admin, who sees every run's program.
  std::string token = Token("");
  rpc::ChannelOptions channel;
  if (auto local = server::LoadState(); local.ok() && local->address == address &&
                                        server::IsClusterProcess(local->controller_pid, *local)) {
    token = local->cluster_token;
    channel = server::ChannelTo(*local, "");
  }
  channel.token = token;
  auto c = rpc::RemoteController::Dial(address, channel, absl::Seconds(5));
  if (!c.ok()) return Fail(c.status());
  auto st = (*c)->FullStatus();
  if (!st.ok()) return Fail(st.status());
  const std::string json = server::StatusJson(*st, address);
  if (json_) {
    std::printf("%s\n", json.c_str());
    return 0;
  }
  const nlohmann::json j = nlohmann::json::parse(json);
  const int64_t ici = j["ici_bytes_received"], dcn = j["dcn_bytes_received"];
  const int64_t ici_wire = j["ici_wire_bytes_received"], dcn_wire = j["dcn_wire_bytes_received"];
  std::printf("cluster %s: %lld clients, %lld runs in flight, %lld completed, %lld buffers\n",
              address.c_str(), (long long)st->clients(), (long long)st->runs_in_flight(),
              (long long)st->runs_completed(), (long long)st->logical_buffers());
  std::printf(
      "transfers received: ICI %s (%s on the wire), DCN %s (%s on the wire); scheduler "
      "queues:",
      Bytes(ici).c_str(), Bytes(ici_wire).c_str(), Bytes(dcn).c_str(), Bytes(dcn_wire).c_str());
  for (int64_t q : st->scheduler_queue_depth()) std::printf(" %lld", (long long)q);
  std::printf("; round trips to the hosts:");
  for (int64_t ns : st->scheduler_round_trip_ns()) std::printf(" %.3f ms", ns / 1e6);
  const int64_t saved = j["checkpoint_bytes_saved"], loaded = j["checkpoint_bytes_loaded"];
  if (saved > 0 || loaded > 0)
    std::printf("\ncheckpoints: %s written, %s read by the workers", Bytes(saved).c_str(),
                Bytes(loaded).c_str());
  if (st->running_size() > 0) {
    std::printf("\nrunning:");
    for (const auto& r : st->running())
      std::printf(" run:%lld '%s' (client:%lld)", (long long)r.run(), r.program().c_str(),
                  (long long)r.client());
  }
  std::printf("\n");
  PrintTenants(*st);
  std::printf("%-6s %-7s %-22s %-6s %-10s %-8s %s\n", "host", "island", "address", "alive",
              "buffers", "dispatch", "devices (memory in use / capacity, queue, executed)");
  for (const auto& h : j["hosts"]) {
    std::string devices;
    if (h.contains("status_error"))
      devices = absl::StrCat("no status: ", h["status_error"].get<std::string>());
    if (h.contains("devices"))
      for (const auto& d : h["devices"])
        absl::StrAppend(&devices, "d", d["device"].get<int64_t>(), ": ",
                        Bytes(d["memory_in_use"].get<int64_t>()), "/",
                        Bytes(d["memory_capacity"].get<int64_t>()), " q",
                        d["queue_depth"].get<int64_t>(), " x", d["executed"].get<int64_t>(),
                        d["alive"].get<bool>() ? "" : " DEAD", "  ");
    std::printf("%-6lld %-7s %-22s %-6s %-10s %-8s %s\n", (long long)h["host"].get<int64_t>(),
                h.contains("island") ? std::to_string(h["island"].get<int64_t>()).c_str() : "-",
                h["address"].get<std::string>().c_str(), h["alive"].get<bool>() ? "yes" : "no",
                h.contains("buffers") ? std::to_string(h["buffers"].get<int64_t>()).c_str() : "-",
                h.contains("dispatch_queue_depth")
                    ? std::to_string(h["dispatch_queue_depth"].get<int64_t>()).c_str()
                    : "-",
                h.contains("reason") ? h["reason"].get<std::string>().c_str() : devices.c_str());
  }
  return 0;
}

int ClusterCommands::Controller() {
  auto spec = SpecFrom(config_, islands_, hosts_per_island_, devices_per_host_);
  if (!spec.ok()) return Fail(spec.status());
  server::ControllerServer* running = nullptr;
  pw::Mutex mu;
  OnStopSignal([&] {
    pw::MutexLock lock(&mu);
    if (running != nullptr) running->Shutdown();
    else std::_Exit(0);
  });
  server::ControllerServer::Options o;
  o.listen = listen_;
  o.channel.token = Token(token_);
  auto tls = dataplane::LoadTls({tls_cert_, tls_key_, tls_ca_, tls_server_name_}, /*server=*/true);
  if (!tls.ok()) return Fail(tls.status());
  o.channel.tls = *tls;
  o.insecure = insecure_;
  o.cluster_token = Token(cluster_token_, "PW_CLUSTER_TOKEN");
  if (o.cluster_token.empty())
    return Fail(absl::InvalidArgumentError(
        "pw controller needs a cluster token, shared with its workers and no one else: set "
        "PW_CLUSTER_TOKEN (e.g. to the output of `head -c16 /dev/urandom | od -An -tx1 | tr -d "
        "' \\n'`) for the controller and every worker"));
  o.failure_timeout = absl::Milliseconds(failure_timeout_ms_);
  o.clients.max_clients = max_clients_;
  o.default_run_timeout = absl::Milliseconds(run_timeout_ms_);
  o.max_program_nodes = max_program_nodes_;
  o.definitions = definitions_;
  o.max_client_bytes = max_client_bytes_;
  o.checkpoint_root = checkpoint_root_;
  o.scheduling = {scheduling_, absl::Microseconds(std::llround(scheduling_window_ms_ * 1000))};
  o.metrics_listen = MetricsListen(listen_, metrics_port_);
  o.clients.session_grace = absl::Milliseconds(session_grace_ms_);
  o.heartbeat_interval = std::min(absl::Milliseconds(200), o.failure_timeout / 4);
  auto server = server::ControllerServer::Start(*spec, o);
  if (!server.ok()) return Fail(server.status());
  {
    pw::MutexLock lock(&mu);
    running = server->get();
  }
  std::fprintf(stderr, "pw controller: serving %zu hosts at %s\n", spec->hosts().size(),
               (*server)->address().c_str());
  if (!address_file_.empty()) {
    const std::string tmp = address_file_ + ".tmp";
    std::ofstream(tmp) << (*server)->address() << "\n";
    std::rename(tmp.c_str(), address_file_.c_str());
  }
  (*server)->WaitForShutdown();
  std::fprintf(stderr, "pw controller: shutting down\n");
  {
    pw::MutexLock lock(&mu);
    running = nullptr;
  }
  server->reset();
  return 0;
}

int ClusterCommands::Supervise() {
  absl::Status s = server::SuperviseWorkers(supervise_state_dir_);
  return s.ok() ? 0 : Fail(s);
}

int ClusterCommands::Worker() {
  if (!cpus_.empty()) {
    // Before the server starts its threads (they inherit the binding).
    absl::StatusOr<std::vector<int>> cpus = server::ParseCpuList(cpus_);
    if (!cpus.ok()) return Fail(cpus.status());
    if (absl::Status s = server::BindProcessToCpus(*cpus); !s.ok()) return Fail(s);
    std::fprintf(stderr, "pw worker: host:%lld runs on CPUs %s\n", (long long)host_,
                 server::FormatCpuList(*cpus).c_str());
  }
  // Before this process makes any segment: those of a crashed worker, or of the image this one
  // replaced when it restarted in place, hold shared memory until unlinked.
  dataplane::RemoveStaleSegments(/*this_process=*/true);
  server::WorkerServer* running = nullptr;
  pw::Mutex mu;
  OnStopSignal([&] {
    pw::MutexLock lock(&mu);
    if (running != nullptr) running->Stop();
    else std::_Exit(0);
  });
  server::WorkerServer::Options o;
  o.controller = controller_address_;
  o.host = HostId(host_);
  o.listen = listen_;
  o.metrics_listen = MetricsListen(listen_, metrics_port_);
  o.bulk_port = bulk_port_;
  o.channel.token = Token(cluster_token_, "PW_CLUSTER_TOKEN");
  auto tls = dataplane::LoadTls({tls_cert_, tls_key_, tls_ca_, tls_server_name_}, /*server=*/true);
  if (!tls.ok()) return Fail(tls.status());
  o.channel.tls = *tls;
  o.insecure = insecure_;
  o.machine = machine_;
  if (collective_timeout_ms_ > 0) o.collective_timeout = absl::Milliseconds(collective_timeout_ms_);
  if (overrun_grace_ms_ >= 0) o.overrun_grace = absl::Milliseconds(overrun_grace_ms_);
  auto server = server::WorkerServer::Start(o);
  if (!server.ok()) return Fail(server.status());
  {
    pw::MutexLock lock(&mu);
    running = server->get();
  }
  std::fprintf(stderr, "pw worker: host:%lld serving at %s\n", (long long)host_,
               (*server)->address().c_str());
  const absl::Status why = (*server)->WaitForStop();
  std::fprintf(stderr, "pw worker: host:%lld stopping%s%s\n", (long long)host_,
               why.ok() ? "" : ": ", why.ok() ? "" : why.ToString().c_str());
  if ((*server)->restart_requested()) {
    // A device thread may never return from its computation: replace the process image in
    // place (same pid, same arguments) instead of tearing the server down. The new worker
    // rejoins the cluster as this host.
    std::fflush(nullptr);
    RestartInPlace();  // Returns only if exec failed.
    std::_Exit(1);
  }
  {
    pw::MutexLock lock(&mu);
    running = nullptr;
  }
  server->reset();
  return why.ok() ? 0 : 1;  // Non-zero: a cluster manager restarts it.
}

}  // namespace pw::cli
