#include "pw/bench/collectives_bench.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "pw/base/status_macros.h"
#include "pw/bench/raw_tcp.h"
#include "pw/client/client.h"
#include "pw/rpc/remote_controller.h"
#include "pw/server/local_cluster.h"

namespace pw {
namespace {

using Clock = std::chrono::steady_clock;

// Most bytes (P^2 x buffer) the broadcast baseline may hold across the processes.
constexpr double kBroadcastBudget = 2.0 * (1 << 30);

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

absl::Status RunOnce(const BoundFunction& f, const Array& input) {
  PW_ASSIGN_OR_RETURN(std::vector<Array> out, f.Call({input}));
  return out[0].Ready().Await();
}

// Seconds per call of `op`, over at least `min_seconds` and 3 calls.
absl::StatusOr<double> TimePerCall(double min_seconds, const std::function<absl::Status()>& op) {
  PW_RETURN_IF_ERROR(op());  // Warm.
  int n = 0;
  const auto start = Clock::now();
  while (n < 3 || Seconds(start) < min_seconds) {
    PW_RETURN_IF_ERROR(op());
    ++n;
  }
  return Seconds(start) / n;
}

// x -> all_reduce_sum(x), `k` times: one node holding k collectives (`algorithm`: the kernel's
// attribute, 0 auto, 1 broadcast).
NativeFunctionDef Reduces(int64_t elements, int k, int algorithm) {
  NativeFunctionBuilder b(absl::StrCat("all_reduce_x", k, algorithm == 1 ? "_broadcast" : ""));
  int x = b.Input({DType::kF32, Shape({elements})});
  for (int i = 0; i < k; ++i) x = b.Op("all_reduce_sum", {x}, {{"algorithm", algorithm}});
  return b.Build({x});
}

// One algorithm's all-reduces of one size, ready to time.
struct Measured {
  BoundFunction many;
  int k = 1;
  double best = 0;  // Seconds per all-reduce, the best round.
};

// Checks the all-reduce of `bytes` per shard with `algorithm` and returns how many all-reduces
// one node should hold for a run to take about 50 ms (at most 512), so a run's own overhead
// (about a millisecond on a cluster) is spread thin.
absl::StatusOr<int> Size(Client& client, const Slice& slice, const Array& input, int64_t bytes,
                         int algorithm) {
  const int p = slice.num_devices();
  PW_ASSIGN_OR_RETURN(BoundFunction one, client.Pmap(Reduces(bytes / 4, 1, algorithm), slice));
  PW_ASSIGN_OR_RETURN(std::vector<Array> check, one.Call({input}));
  PW_ASSIGN_OR_RETURN(HostArray result, check[0].ToHost());
  for (float v : {result.values<float>().front(), result.values<float>().back()}) {
    if (v != static_cast<float>(p))  // The sum of p ones, on every shard.
      return absl::InternalError(absl::StrCat("all-reduce computed ", v, ", expected ", p));
  }
  PW_ASSIGN_OR_RETURN(double single, TimePerCall(0.02, [&] { return RunOnce(one, input); }));
  return static_cast<int>(std::clamp(0.05 / single, 1.0, 512.0));
}

// Starts a local cluster of `p` one-device workers.
absl::StatusOr<server::LocalClusterState> Start(const CollectivesBenchOptions& o, int p) {
  PW_ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::Uniform(1, p, 1, int64_t{1} << 30));
  server::LaunchOptions lo;
  lo.pw_binary = o.pw_binary;
  lo.failure_timeout_ms = 60000;  // A stall of this loaded machine must not fail a worker.
  return server::LaunchLocalCluster(spec, lo);
}

}  // namespace

absl::StatusOr<std::vector<CollectivesBenchResult>> RunCollectivesBench(
    const CollectivesBenchOptions& opts) {
  CollectivesBenchOptions o = opts;
  if (o.sizes.empty()) o.sizes = {8, 1024, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  for (int64_t s : o.sizes)
    if (s <= 0 || s % 4 != 0)
      return absl::InvalidArgumentError(absl::StrCat("size ", s, " is not a multiple of 4"));
  for (int p : o.processes)
    if (p < 2) return absl::InvalidArgumentError("an all-reduce across processes needs >= 2");
  // The clusters' state lives in a directory of the bench's own, not the user's `pw up` state.
  char tmpl[] = "/tmp/pw-bench-collectives.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("cannot make a state directory");
  const std::string dir = tmpl;
  const char* old = std::getenv("PW_STATE_DIR");
  const std::string saved = old == nullptr ? "" : old;
  setenv("PW_STATE_DIR", dir.c_str(), 1);
  absl::Cleanup restore = [&] {
    if (saved.empty()) unsetenv("PW_STATE_DIR");
    else setenv("PW_STATE_DIR", saved.c_str(), 1);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  };
  RawTcp tcp;
  PW_RETURN_IF_ERROR(tcp.Open());
  std::vector<CollectivesBenchResult> results;
  const std::vector<std::string> names = {"auto", "broadcast"};
  const int algorithms = o.baseline ? 2 : 1;
  constexpr int kRounds = 3;  // Interleaved: noise on this shared machine hits both alike.
  for (int p : o.processes) {
    PW_ASSIGN_OR_RETURN(server::LocalClusterState cluster, Start(o, p));
    absl::Cleanup stop = [&] { (void)server::StopLocalCluster(cluster); };
    PW_ASSIGN_OR_RETURN(auto remote, rpc::RemoteController::Dial(cluster.address, {}));
    PW_ASSIGN_OR_RETURN(auto client, Client::Connect(remote.get(), "collectives-bench"));
    PW_ASSIGN_OR_RETURN(Slice slice, client->MakeVirtualDeviceSet().AddSlice({.num_devices = p}));
    for (int64_t bytes : o.sizes) {
      std::vector<float> ones(static_cast<size_t>(bytes / 4 * p), 1.f);
      PW_ASSIGN_OR_RETURN(HostArray host,
                          HostArray::Of<float>(DType::kF32, Shape({p, bytes / 4}), ones));
      PW_ASSIGN_OR_RETURN(Array input,
                          client->Put(host, slice.info().id, Sharding::Split({p}, 2, 0)));
      // The broadcast holds every process's inputs in every process (P^2 buffers in all, with
      // its transport's copies on top): past a few GiB it would take this machine's memory.
      const int measured = algorithms > 1 && static_cast<double>(bytes) * p * p > kBroadcastBudget
                               ? 1
                               : algorithms;
      if (measured < algorithms)
        std::fprintf(stderr, "collectives bench: P=%d %lld B: broadcast skipped (%d^2 x %lld B "
                             "exceeds its %.0f GiB budget)\n",
                     p, (long long)bytes, p, (long long)bytes, kBroadcastBudget / (1 << 30));
      // The same number of all-reduces per run for every algorithm (sized by the first), so
      // each run's overhead weighs alike.
      int k = 0;
      for (int a = 0; a < measured; ++a) {
        PW_ASSIGN_OR_RETURN(int ka, Size(*client, slice, input, bytes, a));
        if (a == 0) k = ka;
      }
      std::vector<Measured> m;
      for (int a = 0; a < measured; ++a) {
        PW_ASSIGN_OR_RETURN(BoundFunction many, client->Pmap(Reduces(bytes / 4, k, a), slice));
        m.push_back({std::move(many), k});
      }
      for (int round = 0; round < kRounds; ++round) {
        for (Measured& x : m) {
          PW_ASSIGN_OR_RETURN(double t, TimePerCall(o.min_seconds / kRounds,
                                                    [&] { return RunOnce(x.many, input); }));
          const double per = t / x.k;
          x.best = x.best == 0 ? per : std::min(x.best, per);
        }
      }
      std::vector<char> src(bytes, 1), dst(bytes);
      PW_ASSIGN_OR_RETURN(double mt, TimePerCall(o.min_seconds / 4, [&] {
        std::memcpy(dst.data(), src.data(), bytes);
        return absl::OkStatus();
      }));
      PW_ASSIGN_OR_RETURN(double tt, TimePerCall(o.min_seconds / 4, [&] { return tcp.Send(src); }));
      for (int a = 0; a < measured; ++a) {
        const double t = m[a].best;
        CollectivesBenchResult r{p, bytes, names[a], t,
                                 static_cast<double>(bytes) * 2 * (p - 1) / p / t / 1e9,
                                 bytes / mt / 1e9, bytes / tt / 1e9};
        std::fprintf(stderr,
                     "collectives bench: P=%d %-9s %10lld B  %10.1f us  bus %7.3f GB/s  "
                     "(memcpy %6.2f, tcp %6.2f)\n",
                     p, r.algorithm.c_str(), (long long)bytes, t * 1e6, r.bus_gbps, r.memcpy_gbps,
                     r.tcp_gbps);
        results.push_back(r);
      }
    }
  }
  return results;
}

std::string CollectivesBenchJson(const std::vector<CollectivesBenchResult>& results) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : results) {
    rows.push_back({{"processes", r.processes}, {"bytes", r.bytes}, {"algorithm", r.algorithm},
                    {"seconds", r.seconds}, {"bus_gbps", r.bus_gbps},
                    {"memcpy_gbps", r.memcpy_gbps}, {"tcp_gbps", r.tcp_gbps}});
  }
  return nlohmann::json{{"benchmark", "collectives"}, {"results", rows}}.dump();
}

}  // namespace pw
