#include "pw/bench/dispatch_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "pw/base/status_macros.h"
#include "pw/client/client.h"
#include "pw/embedded/embedded_cluster.h"

namespace pw {
namespace {

using Clock = std::chrono::steady_clock;

// all_reduce_max keeps the value bounded (x -> max over shards + 1), so the final value checks
// that every computation ran: start + chain.
NativeFunctionDef Steps(const std::string& name, int n) {
  NativeFunctionBuilder b(name);
  int x = b.Input({DType::kF32, Shape({})});
  for (int i = 0; i < n; ++i) {
    x = b.Op("all_reduce_max", {x});
    x = b.Op("add_scalar", {x}, {{"value", 1.0}});
  }
  return b.Build({x});
}

struct Workload {
  std::string name;
  // Runs `chain` computations starting from `in`; returns the output once enqueued.
  std::function<absl::StatusOr<Array>(const Array& in, DispatchMode mode)> run;
};

absl::Status Check(const Array& out, float want, const std::string& what) {
  PW_ASSIGN_OR_RETURN(HostArray h, out.ToHost());
  for (float v : h.values<float>()) {
    if (v != want)
      return absl::InternalError(absl::StrCat(what, ": got ", v, ", expected ", want));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<DispatchBenchResult>> RunDispatchBench(const DispatchBenchOptions& o) {
  if (o.islands <= 0 || o.hosts <= 0 || o.hosts % o.islands != 0 || o.devices_per_host <= 0 ||
      o.chain <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dispatch bench needs hosts (", o.hosts, ") divisible by islands (", o.islands,
        "), devices_per_host > 0 and chain > 0"));
  }
  PW_ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::Uniform(o.islands, o.hosts / o.islands,
                                                             o.devices_per_host));
  PW_ASSIGN_OR_RETURN(auto cluster, EmbeddedCluster::Create(spec));
  return RunDispatchBenchOn(&cluster->controller(), o);
}

absl::StatusOr<std::vector<DispatchBenchResult>> RunDispatchBenchOn(ControllerInterface* controller,
                                                                    DispatchBenchOptions o) {
  if (o.chain <= 0) return absl::InvalidArgumentError("dispatch bench needs chain > 0");
  if (!o.only.empty() && o.only != "opbyop" && o.only != "chained" && o.only != "fused")
    return absl::InvalidArgumentError(absl::StrCat("dispatch bench: no workload '", o.only,
                                                   "' (opbyop, chained or fused)"));
  if (!o.dispatch.empty() && o.dispatch != "parallel" && o.dispatch != "sequential")
    return absl::InvalidArgumentError(absl::StrCat("dispatch bench: no dispatch mode '",
                                                   o.dispatch, "' (parallel or sequential)"));
  // The slice spans every live device of the cluster.
  int n = 0;
  PW_ASSIGN_OR_RETURN(const ClusterStatus status, StatusOfEveryHost(*controller));
  for (const HostStatus& h : status.hosts)
    for (const DeviceStatus& d : h.devices) n += d.alive;
  if (n == 0) return absl::UnavailableError("dispatch bench: the cluster has no live devices");
  o.hosts = static_cast<int>(status.hosts.size());
  o.devices_per_host = n / o.hosts;
  std::vector<DispatchBenchResult> results;
  {
    PW_ASSIGN_OR_RETURN(auto client, Client::Connect(controller, "dispatch-bench"));
    PW_ASSIGN_OR_RETURN(Slice slice, client->MakeVirtualDeviceSet().AddSlice(
                                            {.num_devices = n,
                                             .placement = SlicePlacement::kSpread}));
    PW_ASSIGN_OR_RETURN(BoundFunction step, client->Pmap(Steps("step", 1), slice));
    PW_ASSIGN_OR_RETURN(BoundFunction fused, client->Pmap(Steps("fused", o.chain), slice));
    ArraySpec global{DType::kF32, Shape({n})};
    PW_ASSIGN_OR_RETURN(Program chained,
                        client->Trace("chained", {global}, [&](std::vector<Value> v) {
                          Value x = v[0];
                          for (int i = 0; i < o.chain; ++i) x = step(x);
                          return std::vector<Value>{x};
                        }));
    std::vector<Workload> workloads = {
        {"opbyop",
         [&](const Array& in, DispatchMode mode) -> absl::StatusOr<Array> {
           Array x = in;
           for (int i = 0; i < o.chain; ++i) {
             PW_ASSIGN_OR_RETURN(auto outs, step.Call({x}, mode));
             x = outs[0];
           }
           return x;
         }},
        {"chained",
         [&](const Array& in, DispatchMode mode) -> absl::StatusOr<Array> {
           PW_ASSIGN_OR_RETURN(auto outs, chained.Run({in}, mode));
           return outs[0];
         }},
        {"fused",
         [&](const Array& in, DispatchMode mode) -> absl::StatusOr<Array> {
           PW_ASSIGN_OR_RETURN(auto outs, fused.Call({in}, mode));
           return outs[0];
         }},
    };
    std::vector<float> zeros(n, 0.f);
    PW_ASSIGN_OR_RETURN(HostArray h0, HostArray::Of<float>(DType::kF32, Shape({n}), zeros));
    PW_ASSIGN_OR_RETURN(Array x0, client->Put(h0, slice.info().id, Sharding::Split({n}, 1, 0)));
    PW_RETURN_IF_ERROR(x0.Ready().status());
    // Each workload and mode in `rounds` interleaved rounds (so a burst of noise on this shared
    // machine hits them alike); each keeps its best round.
    const int rounds = std::max(1, o.rounds);
    for (int round = 0; round < rounds; ++round) {
      size_t slot = 0;
      for (DispatchMode mode : {DispatchMode::kParallel, DispatchMode::kSequential}) {
        if (!o.dispatch.empty() && DispatchModeName(mode) != o.dispatch) continue;
        for (const Workload& w : workloads) {
          if (!o.only.empty() && w.name != o.only) continue;
          const std::string what = absl::StrCat(w.name, "/", DispatchModeName(mode));
          if (round == 0) {
            // Warm up (compiles, plans, caches), and check the result.
            PW_ASSIGN_OR_RETURN(Array warm, w.run(x0, mode));
            PW_RETURN_IF_ERROR(Check(warm, static_cast<float>(o.chain), what));
          }
          // Issue iterations back to back, each starting from the previous output, with at
          // most kWindow in flight so the queues stay short and the measurement ends on time.
          constexpr int kWindow = 2;
          std::deque<Array> in_flight;
          int iters = 0;
          auto start = Clock::now();
          double elapsed = 0;
          Array x = x0;
          while (iters < o.min_iterations || elapsed < o.min_seconds / rounds) {
            PW_ASSIGN_OR_RETURN(x, w.run(x, mode));
            ++iters;
            in_flight.push_back(x);
            if (in_flight.size() > kWindow) {
              PW_RETURN_IF_ERROR(in_flight.front().Ready().status());
              in_flight.pop_front();
            }
            elapsed = std::chrono::duration<double>(Clock::now() - start).count();
          }
          in_flight.clear();
          PW_RETURN_IF_ERROR(x.Ready().status());
          elapsed = std::chrono::duration<double>(Clock::now() - start).count();
          PW_RETURN_IF_ERROR(Check(x, static_cast<float>(o.chain) * iters, what));
          DispatchBenchResult r;
          r.workload = w.name;
          r.dispatch = std::string(DispatchModeName(mode));
          r.hosts = o.hosts;
          r.devices_per_host = o.devices_per_host;
          r.computations = static_cast<int64_t>(iters) * o.chain;
          r.seconds = elapsed;
          r.computations_per_second = r.computations / elapsed;
          std::fprintf(stderr,
                       "dispatch bench: round %d %-20s %10.0f computations/s (%d x %d in %.2fs)\n",
                       round + 1, what.c_str(), r.computations_per_second, iters, o.chain, elapsed);
          if (round == 0) {
            results.push_back(r);
          } else if (r.computations_per_second > results[slot].computations_per_second) {
            r.round_rates = std::move(results[slot].round_rates);
            results[slot] = r;
          }
          results[slot].round_rates.push_back(r.computations_per_second);
          ++slot;
        }
      }
    }
  }
  // Overhead per node: time per computation beyond Fused's, in the same dispatch mode.
  for (auto& r : results) {
    for (const auto& f : results) {
      if (f.workload == "fused" && f.dispatch == r.dispatch)
        r.overhead_us_per_node =
            1e6 / r.computations_per_second - 1e6 / f.computations_per_second;
    }
  }
  return results;
}

std::string DispatchBenchJson(const DispatchBenchOptions& o,
                              const std::vector<DispatchBenchResult>& results) {
  nlohmann::json j;
  j["results"] = nlohmann::json::array();
  auto cps = [&](const std::string& w, const std::string& d) {
    for (const auto& r : results)
      if (r.workload == w && r.dispatch == d) return r.computations_per_second;
    return 0.0;
  };
  for (const auto& r : results) {
    j["results"].push_back({{"workload", r.workload},
                            {"dispatch", r.dispatch},
                            {"hosts", r.hosts},
                            {"devices_per_host", r.devices_per_host},
                            {"computations", r.computations},
                            {"seconds", r.seconds},
                            {"computations_per_second", r.computations_per_second}});
    if (cps("fused", r.dispatch) > 0)  // Beyond Fused's time, so only where Fused ran.
      j["results"].back()["overhead_us_per_node"] = r.overhead_us_per_node;
  }
  const DispatchBenchResult* chained = nullptr;
  const DispatchBenchResult* fused = nullptr;
  for (const auto& r : results) {
    if (r.dispatch != "parallel") continue;
    if (r.workload == "chained") chained = &r;
    if (r.workload == "fused") fused = &r;
  }
  j["summary"] = {
      {"cluster", o.cluster.empty() ? "embedded" : o.cluster},
      {"islands", o.islands},
      {"chain", o.chain},
      {"rounds", o.rounds},
      {"statistic",
       "best round of each workload and mode; chained_overhead_us_per_node_paired_median: "
       "median over rounds of chained minus fused in the same round"},
  };
  // Ratios and overheads of workloads and modes that ran (--only and --dispatch leave some out).
  auto ratio = [&](const char* key, double a, double b) {
    if (a > 0 && b > 0) j["summary"][key] = a / b;
  };
  ratio("chained_over_fused", cps("chained", "parallel"), cps("fused", "parallel"));
  ratio("chained_over_opbyop", cps("chained", "parallel"), cps("opbyop", "parallel"));
  ratio("chained_parallel_over_sequential", cps("chained", "parallel"),
        cps("chained", "sequential"));
  if (o.loopback_rtt_us > 0) j["summary"]["loopback_rtt_us"] = o.loopback_rtt_us;
  if (o.jax_computations_per_second > 0) {
    j["summary"]["jax_pmap_computations_per_second"] = o.jax_computations_per_second;
    j["summary"]["jax_pmap_devices"] = o.jax_devices;
    ratio("opbyop_over_jax_pmap", cps("opbyop", "parallel"), o.jax_computations_per_second);
  }
  if (chained == nullptr || fused == nullptr) return j.dump(2);
  // Chained's overhead per node in each round against Fused's in the same round (the two run
  // back to back, so slow drifts of this machine cancel), and the median over rounds.
  std::vector<double> paired;
  for (size_t i = 0; i < chained->round_rates.size() && i < fused->round_rates.size(); ++i)
    paired.push_back(1e6 / chained->round_rates[i] - 1e6 / fused->round_rates[i]);
  double paired_median = 0;
  if (!paired.empty()) {
    std::vector<double> sorted = paired;
    std::sort(sorted.begin(), sorted.end());
    const size_t m = sorted.size() / 2;
    paired_median = sorted.size() % 2 == 1 ? sorted[m] : (sorted[m - 1] + sorted[m]) / 2;
  }
  const double chained_overhead = chained->overhead_us_per_node;
  j["summary"]["chained_overhead_us_per_node"] = chained_overhead;
  j["summary"]["chained_overhead_us_per_node_by_round"] = paired;
  j["summary"]["chained_overhead_us_per_node_paired_median"] = paired_median;
  if (o.loopback_rtt_us > 0) {
    j["summary"]["chained_overhead_over_loopback_rtt"] = chained_overhead / o.loopback_rtt_us;
    j["summary"]["chained_overhead_paired_median_over_loopback_rtt"] =
        paired_median / o.loopback_rtt_us;
  }
  return j.dump(2);
}

std::string DispatchBenchTable(const std::vector<DispatchBenchResult>& results) {
  std::string s = absl::StrFormat("%-10s %-11s %6s %8s %16s %12s\n", "workload", "dispatch",
                                  "hosts", "dev/host", "computations/s", "overhead_us");
  for (const auto& r : results)
    absl::StrAppend(&s, absl::StrFormat("%-10s %-11s %6d %8d %16.0f %12.2f\n", r.workload,
                                        r.dispatch, r.hosts, r.devices_per_host,
                                        r.computations_per_second, r.overhead_us_per_node));
  return s;
}

}  // namespace pw
