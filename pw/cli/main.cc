// pw: the pathways command line.
//
//   pw up [--config FILE | --islands I --hosts-per-island H --devices-per-host D] [--detach]
//         [--cpu-bind host|none]
//   pw status [--json] [--cluster ADDRESS]
//   pw down
//   pw controller --config FILE [--listen ADDR] [--address-file F]   (started by pw up)
//   pw worker --controller ADDR --host N [--listen ADDR] [--cpus LIST] (started by pw up)
//   pw example figure2 [--cluster ADDRESS | --config FILE | --islands I --hosts-per-island H ...]
//   pw bench dispatch [--cluster ADDRESS | --islands I --hosts H --devices-per-host D] [--chain N]
//                     [--rounds R] [--only W] [--dispatch parallel|sequential] [--json]
//
// Client commands use --cluster ADDRESS, else $PW_CLUSTER, else the cluster `pw up` started
// most recently (if it is running), else an embedded cluster in this process. Servers listening
// on a non-loopback address need a token (--token or $PW_TOKEN); clients send $PW_TOKEN.
// `pw bench transfer` is the exception: it runs in this process unless given --cluster.
//   pw bench transfer [--json] [--sizes B,B,...] [--min-seconds S] [--cluster ADDRESS]
//   pw bench xla-overhead [--json] [--min-seconds S] [--chain N] [--sizes N,N,...]
//   pw bench collectives [--json] [--baseline] [--processes P,P,...] [--sizes B,B,...]
//   pw bench lm [--json] [--cluster ADDRESS] [--steps N] [--timed-steps N] [--layouts L,...]
//   pw bench mpmd [--json] [--cluster ADDRESS | --no-cluster] [--no-jax] [--min-seconds S]
//                 (without --cluster or $PW_CLUSTER it starts its own cluster with pw up)
//   pw kernels
//
// Results go to stdout; progress and logs to stderr.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "pw/cli/plot.h"
#include "pw/base/mutex.h"
#include "pw/bench/collectives_bench.h"
#include "pw/bench/dispatch_bench.h"
#include "pw/bench/io_bench.h"
#include "pw/bench/loopback_rtt.h"
#include "pw/bench/multitenant_bench.h"
#include "pw/bench/transfer_bench.h"
#include "pw/cli/cluster_commands.h"
#include "pw/embedded/embedded_cluster.h"
#include "pw/examples/figure2.h"
#include "pw/rpc/remote_controller.h"
#include "pw/server/local_cluster.h"

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pw: %s\n", s.ToString().c_str());
  return 1;
}

std::string EnvToken() {
  const char* t = std::getenv("PW_TOKEN");
  return t == nullptr ? "" : t;
}

// The controller a client command talks to: a remote one, or an embedded cluster's.
struct Target {
  std::unique_ptr<pw::rpc::RemoteController> remote;
  std::unique_ptr<pw::EmbeddedCluster> embedded;
  pw::ControllerInterface* controller = nullptr;
};

// A client's connection to the cluster at `address`, with $PW_TOKEN; says so on stderr.
absl::StatusOr<std::unique_ptr<pw::rpc::RemoteController>> Dial(const std::string& address,
                                                                const char* what) {
  auto remote = pw::rpc::RemoteController::Dial(address, {.token = EnvToken()});
  if (remote.ok()) std::fprintf(stderr, "pw: %s the cluster at %s\n", what, address.c_str());
  return remote;
}

absl::StatusOr<Target> Connect(const std::string& cluster_flag, const pw::ClusterSpec& spec) {
  Target t;
  const std::string address = pw::server::ClusterAddress(cluster_flag);
  if (!address.empty()) {
    auto remote = Dial(address, "using");
    if (!remote.ok()) return remote.status();
    t.remote = *std::move(remote);
    t.controller = t.remote.get();
    return t;
  }
  auto cluster = pw::EmbeddedCluster::Create(spec);
  if (!cluster.ok()) return cluster.status();
  t.embedded = *std::move(cluster);
  t.controller = &t.embedded->controller();
  return t;
}

// `--plot FILE.png`: the result JSON drawn by python -m pathways.plots (nothing when empty).
int Plot(const std::string& bench, const std::string& result_json, const std::string& png) {
  if (png.empty()) return 0;
  char tmpl[] = "/tmp/pw-bench-XXXXXX.json";
  const int fd = mkstemps(tmpl, 5);
  if (fd < 0) return Fail(absl::InternalError("pw bench --plot: cannot make a temporary file"));
  const bool wrote = write(fd, result_json.data(), result_json.size()) ==
                     static_cast<ssize_t>(result_json.size());
  close(fd);
  const int rc = wrote ? pw::cli::RunPlotter({"bench", bench, tmpl, png}) : 1;
  unlink(tmpl);
  return rc;
}

// JAX's own dispatch of the bench's step over `devices` CPU devices of one process, after ours
// on this machine, into `o` (pathways.jax_dispatch_bench).
absl::Status MeasureJaxDispatch(int devices, pw::DispatchBenchOptions* o) {
  auto out = pw::cli::RunPythonModule(
      "pathways.jax_dispatch_bench",
      {"--devices", std::to_string(devices), "--chain", std::to_string(o->chain), "--rounds",
       std::to_string(o->rounds), "--seconds",
       std::to_string(o->min_seconds / std::max(1, o->rounds))});
  if (!out.ok()) return out.status();
  auto j = nlohmann::json::parse(*out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("computations_per_second"))
    return absl::InternalError("pathways.jax_dispatch_bench printed no computations_per_second");
  o->jax_computations_per_second = j["computations_per_second"].get<double>();
  o->jax_devices = devices;
  return absl::OkStatus();
}

// Replaces this process with `python -m module args...` (the benchmarks written in Python).
int ExecPythonModule(const std::string& module, const std::vector<std::string>& args) {
  std::string python = pw::cli::Python();
  std::vector<std::string> words = {python, "-m", module};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& w : words) cargv.push_back(w.data());
  cargv.push_back(nullptr);
  execv(python.c_str(), cargv.data());
  return Fail(absl::FailedPreconditionError(
      "cannot run " + python + " (set PW_PYTHON, or run scripts/install-deps.sh and make python)"));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pathways: a single-controller asynchronous distributed dataflow runtime"};
  app.require_subcommand(1);

  auto* example = app.add_subcommand("example", "Run an example program");
  example->require_subcommand(1);
  auto* fig2 = example->add_subcommand("figure2", "The paper's Figure 2 program");
  std::string config;
  int islands = 2, hosts_per_island = 2, devices_per_host = 2;
  bool explain = false;
  fig2->add_option("--config", config, "Cluster spec (JSON)");
  fig2->add_option("--islands", islands, "Islands of the embedded cluster");
  fig2->add_option("--hosts-per-island", hosts_per_island, "Hosts per island");
  fig2->add_option("--devices-per-host", devices_per_host, "Devices per host");
  fig2->add_flag("--explain", explain, "Print the program's sharded dataflow graph to stderr");
  std::string cluster;
  fig2->add_option("--cluster", cluster, "Address of a running cluster (default: $PW_CLUSTER, "
                                         "else the last `pw up` cluster, else embedded)");

  auto* bench = app.add_subcommand("bench", "Run a benchmark");
  bench->require_subcommand(1);
  auto* dispatch = bench->add_subcommand("dispatch", "The paper's §5.1 dispatch benchmark");
  pw::DispatchBenchOptions bo;
  bool json = false;
  dispatch->add_option("--islands", bo.islands, "Islands");
  dispatch->add_option("--hosts", bo.hosts, "Hosts in all");
  dispatch->add_option("--devices-per-host", bo.devices_per_host, "Devices per host");
  dispatch->add_option("--chain", bo.chain, "Computations per chain");
  dispatch->add_option("--min-seconds", bo.min_seconds, "Minimum time per measurement");
  dispatch->add_option("--rounds", bo.rounds, "Interleaved rounds; each measurement keeps its best");
  dispatch->add_option("--only", bo.only, "Run one workload: opbyop, chained or fused")
      ->check(CLI::IsMember({"opbyop", "chained", "fused"}));
  dispatch->add_option("--dispatch", bo.dispatch, "Run one dispatch mode: parallel or sequential")
      ->check(CLI::IsMember({"parallel", "sequential"}));
  dispatch->add_flag("--json", json, "Print one JSON object to stdout");
  bool with_jax = false;
  dispatch->add_flag("--jax", with_jax,
                     "Also measure JAX's own dispatch of the same step in one process (jax.pmap "
                     "over as many CPU devices, before and after; the best is reported)");
  std::string plot;
  dispatch->add_option("--plot", plot, "Also draw the results to this PNG (matplotlib)");
  dispatch->add_option("--cluster", cluster, "Address of a running cluster (default: "
                                             "$PW_CLUSTER, else the last `pw up` cluster, "
                                             "else embedded)");

  auto* transfer = bench->add_subcommand(
      "transfer", "Data-plane throughput (ICI: shared memory, DCN: TCP stream) beside memcpy/raw "
                  "TCP, or with --cluster between a running cluster's hosts");
  pw::TransferBenchOptions to;
  transfer
      ->add_option("--sizes", to.sizes,
                   "Sizes in bytes, comma-separated (default 1 KiB ... 256 MiB; with --cluster, "
                   "... 16 MiB)")
      ->delimiter(',');
  transfer->add_option("--min-seconds", to.min_seconds, "Minimum time per measurement");
  transfer->add_option("--rounds", to.rounds, "Interleaved rounds; each measurement keeps its best");
  transfer->add_flag("--json", json, "Print one JSON object to stdout");
  transfer->add_option("--plot", plot, "Also draw the results to this PNG (matplotlib)");
  transfer->add_option("--cluster", cluster,
                       "Measure between the hosts of a running cluster (ICI: same island, DCN: "
                       "another island; baseline: the array already on its device) instead of "
                       "one in this process beside memcpy/raw TCP");

  auto* io = bench->add_subcommand(
      "io", "A client's put and get throughput on a running cluster (1 KiB ... 1 GiB) beside raw "
            "loopback TCP, and the controller's memory growth meanwhile");
  pw::IoBenchOptions io_options;
  io->add_option("--sizes", io_options.sizes,
                 "Sizes in bytes, multiples of 8, comma-separated (default 1 KiB ... 1 GiB)")
      ->delimiter(',');
  io->add_option("--min-seconds", io_options.min_seconds, "Minimum time per measurement");
  io->add_flag("--json", json, "Print one JSON object to stdout");
  io->add_option("--cluster", cluster,
                 "Address of the running cluster (default: $PW_CLUSTER, else the last `pw up` "
                 "cluster)");

  auto* collectives = bench->add_subcommand(
      "collectives", "All-reduce across worker processes (local clusters it starts) beside "
                     "memcpy and raw TCP; --baseline adds the one-round broadcast algorithm");
  pw::CollectivesBenchOptions co;
  collectives->add_option("--processes", co.processes, "Process counts (default 2,4,8)")
      ->delimiter(',');
  collectives->add_option("--sizes", co.sizes, "Bytes per shard (default 8 ... 64 MiB)")
      ->delimiter(',');
  collectives->add_option("--min-seconds", co.min_seconds, "Minimum time per measurement");
  collectives->add_flag("--baseline", co.baseline,
                        "Also measure the broadcast algorithm (rows with algorithm 'broadcast')");
  collectives->add_flag("--json", json, "Print one JSON object to stdout");
  collectives->add_option("--plot", plot, "Also draw the results to this PNG (matplotlib)");

  auto* multitenant = bench->add_subcommand(
      "multitenant", "The paper's Fig. 8/9 workload: K clients (processes, tenants with shares) "
                     "loop a program of a given device time on one island's devices; aggregate "
                     "throughput beside one client's, and each tenant's achieved share");
  pw::MultitenantBenchOptions mt;
  multitenant->add_option("--clients", mt.clients, "Client counts (default 4)")->delimiter(',');
  multitenant->add_option("--shares", mt.shares, "Shares, client i gets the (i mod n)-th "
                                                 "(default 1,2,4,8)")
      ->delimiter(',');
  multitenant->add_option("--compute-ms", mt.compute_ms,
                          "Device time of each call in ms (default 0.33; the paper: 0.04, 0.33, "
                          "1.04, 2.4)")
      ->delimiter(',');
  multitenant->add_option("--seconds", mt.seconds, "Per measurement (default 10)")
      ->check(CLI::Range(1.0, 3600.0));
  multitenant->add_option("--window-ms", mt.window_ms, "Windows for the worst share (default 100)")
      ->check(CLI::Range(1.0, 60000.0));
  multitenant->add_option("--in-flight", mt.in_flight, "Calls each client keeps in flight "
                                                       "(default 64)")
      ->check(CLI::Range(1, 1024));
  multitenant->add_flag("--late-join", mt.late_join, "The last client starts halfway through");
  multitenant->add_option("--cluster", mt.cluster,
                          "A running cluster (default: one it starts: 1 island x 1 host x 8 "
                          "devices)");
  multitenant->add_flag("--json", json, "Print one JSON object to stdout");
  multitenant->add_option("--plot", plot, "Also draw the results to this PNG (matplotlib)");
  pw::MultitenantClientOptions mtc;
  auto* mt_client = bench->add_subcommand("multitenant-client",
                                          "One client of pw bench multitenant (it starts these)");
  mt_client->group("");  // Hidden.
  mt_client->add_option("--cluster", mtc.cluster)->required();
  mt_client->add_option("--tenant", mtc.tenant)->required();
  mt_client->add_option("--share", mtc.share);
  mt_client->add_option("--compute-ms", mtc.compute_ms);
  mt_client->add_option("--in-flight", mtc.in_flight);
  mt_client->add_option("--start-unix-ns", mtc.start_unix_ns)->required();
  mt_client->add_option("--end-unix-ns", mtc.end_unix_ns)->required();
  mt_client->add_option("--out", mtc.out)->required();

  // Python: it compares against JAX's own dispatch in the same process (python/pathways).
  auto* xla_overhead = bench->add_subcommand(
      "xla-overhead", "An XLA function run by pathways vs by JAX, same CPU, same run (Python)");
  xla_overhead->allow_extras();
  xla_overhead->prefix_command();
  auto* mpmd = bench->add_subcommand(
      "mpmd", "A 3-stage MPMD pipeline on an embedded cluster, on a process cluster (--cluster, "
              "else one it starts with pw up) and in JAX, same run (Python)");
  mpmd->allow_extras();
  mpmd->prefix_command();
  auto* lm = bench->add_subcommand(
      "lm", "The Transformer LM of examples/lm: SPMD, a pipeline, the pipeline over two islands; "
            "tokens/s, idle fraction, DCN bytes, loss vs one device (Python)");
  lm->allow_extras();
  lm->prefix_command();

  auto* kernels = app.add_subcommand("kernels", "List the native host kernels");
  pw::cli::ClusterCommands cluster_commands(&app);

  CLI11_PARSE(app, argc, argv);
  // Debian's abseil is built with debug checks on: its Mutex deadlock detector walks a global
  // graph on every Mutex destruction (one per future), which dominated dispatch profiles.
  // Tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  if (cluster_commands.parsed()) return cluster_commands.Run(argv[0]);
  if (fig2->parsed()) {
    auto spec = config.empty()
                    ? pw::ClusterSpec::Uniform(islands, hosts_per_island, devices_per_host)
                    : pw::ClusterSpec::FromFile(config);
    if (!spec.ok()) return Fail(spec.status());
    auto target = Connect(cluster, *spec);
    if (!target.ok()) return Fail(target.status());
    auto r = pw::RunFigure2(target->controller);
    if (!r.ok()) return Fail(r.status());
    if (explain) std::fprintf(stderr, "%s", r->lowered.c_str());
    std::printf("%s\n", r->ToString().c_str());
    return 0;
  }
  if (dispatch->parsed()) {
    const std::string address = pw::server::ClusterAddress(cluster);
    absl::StatusOr<std::vector<pw::DispatchBenchResult>> r;

    if (address.empty()) {
      r = pw::RunDispatchBench(bo);
    } else {
      auto remote = Dial(address, "dispatch bench on");
      if (!remote.ok()) return Fail(remote.status());
      auto status = (*remote)->Status();
      if (!status.ok()) return Fail(status.status());
      std::set<int64_t> isl;
      for (const auto& h : status->hosts) isl.insert(h.island.value());
      bo.islands = std::max<int>(1, static_cast<int>(isl.size()));
      auto rtt = pw::MeasureLoopbackRttUs();
      if (rtt.ok()) bo.loopback_rtt_us = *rtt;
      r = pw::RunDispatchBenchOn(remote->get(), bo);
      if (r.ok() && !r->empty()) {
        bo.hosts = r->front().hosts;
        bo.devices_per_host = r->front().devices_per_host;
      }
      bo.cluster = address;
    }
    if (!r.ok()) return Fail(r.status());
    if (with_jax && !r->empty()) {
      if (absl::Status s = MeasureJaxDispatch(r->front().hosts * r->front().devices_per_host, &bo);
          !s.ok())
        return Fail(s);
    }
    if (json) {
      std::printf("%s\n", pw::DispatchBenchJson(bo, *r).c_str());
    } else {
      std::printf("%s", pw::DispatchBenchTable(*r).c_str());
    }
    return Plot("dispatch", pw::DispatchBenchJson(bo, *r), plot);
  }
  if (transfer->parsed()) {
    absl::StatusOr<std::vector<pw::TransferBenchResult>> r;
    if (cluster.empty()) {
      r = pw::RunTransferBench(to);
    } else {
      const std::string address = pw::server::ClusterAddress(cluster);
      auto remote = Dial(address, "transfer bench on");
      if (!remote.ok()) return Fail(remote.status());
      r = pw::RunTransferBenchOn(remote->get(), to);
    }
    if (!r.ok()) return Fail(r.status());
    if (json) {
      std::printf("%s\n", pw::TransferBenchJson(*r).c_str());
    } else {
      for (const auto& x : *r)
        std::printf("%-4s %12lld B  %10.1f MB/s  (%s %10.1f MB/s)  ratio %.2f\n", x.path.c_str(),
                    (long long)x.bytes, x.pathways_bytes_per_second / 1e6, x.baseline.c_str(),
                    x.baseline_bytes_per_second / 1e6, x.ratio);
    }
    return Plot(cluster.empty() ? "transfer" : "transfer-cluster", pw::TransferBenchJson(*r), plot);
  }
  if (io->parsed()) {
    const std::string address = pw::server::ClusterAddress(cluster);
    if (address.empty())
      return Fail(absl::FailedPreconditionError(
          "pw bench io needs a running cluster: --cluster ADDRESS, $PW_CLUSTER, or `pw up`"));
    bool admin = false;  // The controller's peak memory is measured as the cluster's admin.
    auto remote = pw::cli::DialAsAdminIfPossible(address, &admin);
    if (!remote.ok()) return Fail(remote.status());
    std::fprintf(stderr, "pw: io bench on the cluster at %s%s\n", address.c_str(),
                 admin ? "" : " (no cluster token: the controller's memory is not measured)");
    io_options.measure_controller_memory = admin;
    auto r = pw::RunIoBench(remote->get(), io_options);
    if (!r.ok()) return Fail(r.status());
    if (json) {
      std::printf("%s\n", pw::IoBenchJson(*r).c_str());
    } else {
      for (const auto& x : *r)
        std::printf("%s %11lld B  %7.3f GB/s  raw TCP %7.3f GB/s  ratio %.2f  controller +%lld B\n",
                    x.op.c_str(), (long long)x.bytes, x.gbps, x.raw_tcp_gbps, x.ratio,
                    (long long)x.controller_rss_growth_bytes.value_or(-1));
    }
    return 0;
  }
  if (collectives->parsed()) {
    co.pw_binary = std::filesystem::read_symlink("/proc/self/exe").string();
    auto r = pw::RunCollectivesBench(co);
    if (!r.ok()) return Fail(r.status());
    if (json) {
      std::printf("%s\n", pw::CollectivesBenchJson(*r).c_str());
    } else {
      for (const auto& x : *r)
        std::printf("P=%d %-9s %12lld B  %10.1f us  bus %8.3f GB/s  memcpy %7.2f  tcp %7.2f\n",
                    x.processes, x.algorithm.c_str(), (long long)x.bytes, x.seconds * 1e6,
                    x.bus_gbps, x.memcpy_gbps, x.tcp_gbps);
    }
    return Plot("collectives", pw::CollectivesBenchJson(*r), plot);
  }
  if (multitenant->parsed()) {
    mt.pw_binary = std::filesystem::read_symlink("/proc/self/exe").string();
    if (mt.cluster.empty() && !cluster.empty()) mt.cluster = cluster;
    auto r = pw::RunMultitenantBench(mt);
    if (!r.ok()) return Fail(r.status());
    const std::string out = pw::MultitenantBenchJson(*r);
    if (json) std::printf("%s\n", out.c_str());
    return Plot("multitenant", out, plot);
  }
  if (mt_client->parsed()) {
    absl::Status s = pw::RunMultitenantClient(mtc);
    if (!s.ok()) return Fail(s);
    return 0;
  }
  if (xla_overhead->parsed())
    return ExecPythonModule("pathways.xla_overhead_bench", xla_overhead->remaining());
  if (mpmd->parsed()) {
    // The bench starts its own cluster with this very binary.
    std::vector<std::string> args = mpmd->remaining();
    std::error_code error;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
    if (!error) args.insert(args.begin(), {"--pw", self.string()});
    return ExecPythonModule("pathways.mpmd_bench", args);
  }
  if (lm->parsed()) return ExecPythonModule("pathways.lm_bench", lm->remaining());
  if (kernels->parsed()) {
    std::printf("%s\n", absl::StrJoin(pw::NativeKernelNames(), "\n").c_str());
    return 0;
  }
  return 0;
}
