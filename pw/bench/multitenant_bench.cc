#include "pw/bench/multitenant_bench.h"

#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "pw/base/status_macros.h"
#include "pw/client/client.h"
#include "pw/rpc/remote_controller.h"
#include "pw/server/local_cluster.h"

namespace pw {
namespace {

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

// x -> all_reduce_sum(hold_device(x, compute)): every device of the slice busy for the compute
// time, then a collective over the slice (its gang order matters).
NativeFunctionDef Step(double compute_ms) {
  NativeFunctionBuilder b("tenant_step");
  int x = b.Input({DType::kF32, Shape({})});
  x = b.Op("hold_device", {x}, {{"micros", compute_ms * 1000}});
  return b.Build({b.Op("all_reduce_sum", {x})});
}

// The devices of island 0.
absl::StatusOr<int> IslandDevices(rpc::RemoteController& remote) {
  PW_ASSIGN_OR_RETURN(ClusterStatus st, StatusOfEveryHost(remote));
  int n = 0;
  for (const HostStatus& h : st.hosts)
    if (h.island == IslandId(0)) n += static_cast<int>(h.devices.size());
  if (n == 0) return absl::FailedPreconditionError("the cluster's island 0 has no devices");
  return n;
}

absl::StatusOr<server::LocalClusterState> StartCluster(const MultitenantBenchOptions& o) {
  PW_ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::Uniform(1, 1, 8));
  server::LaunchOptions lo;
  lo.pw_binary = o.pw_binary;
  lo.failure_timeout_ms = 60000;  // A stall of this loaded machine must not fail a worker.
  lo.scheduling = "share";
  return server::LaunchLocalCluster(spec, lo);
}

struct TenantProcess {
  std::string tenant;
  double share = 1;
  int64_t client = -1;  // Its client id (the first line of its output).
  int pid = -1;
  std::string out;
  std::vector<int64_t> done;  // Finishing times, Unix ns.
};

// Runs `clients` client processes from `start` to `end` (the last from `join` when given) and
// reads their finishing times.
absl::Status RunClients(const MultitenantBenchOptions& o, const std::string& address,
                        const std::string& dir, double compute_ms, int64_t start, int64_t end,
                        int64_t join, std::vector<TenantProcess>& clients) {
  for (size_t i = 0; i < clients.size(); ++i) {
    TenantProcess& c = clients[i];
    c.out = absl::StrCat(dir, "/", c.tenant, ".txt");
    const int64_t from = (join > 0 && i + 1 == clients.size()) ? join : start;
    PW_ASSIGN_OR_RETURN(
        c.pid, server::SpawnDetached(
                   {o.pw_binary, "bench", "multitenant-client", "--cluster", address, "--tenant",
                    c.tenant, "--share", absl::StrCat(c.share), "--compute-ms",
                    absl::StrCat(compute_ms), "--in-flight", absl::StrCat(o.in_flight),
                    "--start-unix-ns", absl::StrCat(from), "--end-unix-ns", absl::StrCat(end),
                    "--out", c.out},
                   absl::StrCat(dir, "/", c.tenant, ".log")));
  }
  absl::Status result;
  for (TenantProcess& c : clients) {
    int status = 0;
    const bool waited = waitpid(c.pid, &status, 0) == c.pid;
    if (!waited || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::ifstream log(absl::StrCat(dir, "/", c.tenant, ".log"));
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      const std::string how = !waited ? absl::StrCat("cannot wait for it: ", strerror(errno))
                              : WIFSIGNALED(status)
                                  ? absl::StrCat("killed by signal ", WTERMSIG(status))
                                  : absl::StrCat("exit status ", WEXITSTATUS(status));
      result.Update(absl::InternalError(absl::StrCat("multitenant bench: client ", c.tenant,
                                                     " failed (", how, "): ", text)));
      continue;
    }
    std::ifstream in(c.out);
    in >> c.client;
    for (int64_t t; in >> t;) c.done.push_back(t);
  }
  return result;
}

// Calls of one client (finishing times sorted) finished in [from, to).
int64_t CountIn(const TenantProcess& c, int64_t from, int64_t to) {
  return std::lower_bound(c.done.begin(), c.done.end(), to) -
         std::lower_bound(c.done.begin(), c.done.end(), from);
}
// The same over every client.
int64_t CountIn(const std::vector<TenantProcess>& clients, int64_t from, int64_t to) {
  int64_t n = 0;
  for (const TenantProcess& c : clients) n += CountIn(c, from, to);
  return n;
}

// Each client's device time (the cluster's own account: the hosts' client_device_ns, which
// count each device's launches, the running ones up to the snapshot, so a sample is not late by
// the acknowledgements still on their way, as the tenants' device_seconds would be) sampled every
// `period` from now until `until`, on a thread of its own.
class DeviceTimeSampler {
 public:
  struct Sample {
    int64_t at;                                 // Unix ns.
    std::map<int64_t, double> device_seconds;  // By client id, summed over hosts.
  };
  DeviceTimeSampler(rpc::RemoteController* remote, int64_t period, int64_t until)
      : thread_([this, remote, period, until] {
          for (int64_t next = NowNs(); next < until; next += period) {
            absl::SleepFor(absl::FromUnixNanos(next) - absl::Now());
            absl::StatusOr<ClusterStatus> st = remote->Status();
            // A missed sample widens one window (a host's error leaves its counts out).
            if (!st.ok() || std::any_of(st->hosts.begin(), st->hosts.end(),
                                        [](const HostStatus& h) { return !h.error.empty(); }))
              continue;
            Sample s{NowNs(), {}};
            for (const HostStatus& h : st->hosts)
              for (const auto& [client, ns] : h.client_device_ns)
                s.device_seconds[client.value()] += static_cast<double>(ns) / 1e9;
            samples_.push_back(std::move(s));
          }
        }) {}
  // Waits for the last sample.
  std::vector<Sample> Take() {
    thread_.join();
    return std::move(samples_);
  }

 private:
  std::vector<Sample> samples_;  // Written by the thread only, read after it is joined.
  std::thread thread_;
};

// Client `me`'s device time over [a, b] of the samples, and everyone's.
std::pair<double, double> Between(const DeviceTimeSampler::Sample& a,
                                  const DeviceTimeSampler::Sample& b, int64_t me) {
  double mine = 0, all = 0;
  for (const auto& [client, seconds] : b.device_seconds) {
    auto before = a.device_seconds.find(client);
    const double d = seconds - (before == a.device_seconds.end() ? 0 : before->second);
    all += d;
    if (client == me) mine = d;
  }
  return {mine, all};
}

// Every client's device time over the devices' time, between the first and the last sample in
// [from, to]; 0 with fewer than two samples there.
double DeviceBusy(const std::vector<DeviceTimeSampler::Sample>& samples, int64_t from, int64_t to,
                  int devices) {
  const DeviceTimeSampler::Sample* first = nullptr;
  const DeviceTimeSampler::Sample* last = nullptr;
  for (const auto& x : samples) {
    if (x.at < from || x.at > to) continue;
    if (first == nullptr) first = &x;
    last = &x;
  }
  if (first == nullptr || last->at <= first->at) return 0;
  return Between(*first, *last, -1).second / (devices * ((last->at - first->at) / 1e9));
}

}  // namespace

absl::Status RunMultitenantClient(const MultitenantClientOptions& o) {
  const char* token = std::getenv("PW_TOKEN");
  PW_ASSIGN_OR_RETURN(auto remote,
                      rpc::RemoteController::Dial(o.cluster, {.token = token ? token : ""}));
  PW_ASSIGN_OR_RETURN(const int n, IslandDevices(*remote));
  PW_ASSIGN_OR_RETURN(auto client, Client::Connect(remote.get(), o.tenant, {o.tenant, o.share}));
  PW_ASSIGN_OR_RETURN(Slice slice, client->MakeVirtualDeviceSet().AddSlice(
                                       {.num_devices = n, .islands = {IslandId(0)}}));
  PW_ASSIGN_OR_RETURN(BoundFunction step, client->Pmap(Step(o.compute_ms), slice));
  PW_ASSIGN_OR_RETURN(HostArray zeros,
                      HostArray::Of<float>(DType::kF32, Shape({n}), std::vector<float>(n, 0.f)));
  PW_ASSIGN_OR_RETURN(Array x, client->Put(zeros, slice.info().id, Sharding::Split({n}, 1, 0)));
  {  // Warm: compiled and loaded everywhere before the clock starts.
    PW_ASSIGN_OR_RETURN(std::vector<Array> out, step.Call({x}));
    PW_RETURN_IF_ERROR(out[0].Ready().Await());
  }
  absl::SleepFor(absl::FromUnixNanos(o.start_unix_ns) - absl::Now());
  // Finishing times, recorded by callbacks on the client's threads. Shared with them: a callback
  // can outlive this function when it returns early; and each call's entry in `in_flight` is
  // ready only once its time is recorded (a future's waiter can wake before its callbacks ran).
  struct FinishTimes {
    pw::Mutex mu;
    std::vector<int64_t> at ABSL_GUARDED_BY(mu);
  };
  auto times = std::make_shared<FinishTimes>();
  std::deque<Future<>> in_flight;
  while (NowNs() < o.end_unix_ns) {
    if (static_cast<int>(in_flight.size()) >= o.in_flight) {
      PW_RETURN_IF_ERROR(in_flight.front().Await());
      in_flight.pop_front();
      continue;
    }
    PW_ASSIGN_OR_RETURN(std::vector<Array> out, step.Call({x}));
    Promise<> recorded;
    in_flight.push_back(recorded.future());
    out[0].Ready().OnReady([times, recorded = std::move(recorded)](const absl::Status& s) mutable {
      if (s.ok()) {
        const int64_t t = NowNs();
        pw::MutexLock lock(&times->mu);
        times->at.push_back(t);
      }
      recorded.Set(s);
    });
  }
  for (Future<>& f : in_flight) PW_RETURN_IF_ERROR(f.Await());
  std::ofstream out(o.out);
  out << client->id().value() << "\n";  // Then the finishing times.
  pw::MutexLock lock(&times->mu);
  std::sort(times->at.begin(), times->at.end());
  for (int64_t t : times->at) out << t << "\n";
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", o.out));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MultitenantBenchResult>> RunMultitenantBench(
    const MultitenantBenchOptions& o) {
  if (o.shares.empty()) return absl::InvalidArgumentError("multitenant bench: no shares");
  for (double s : o.shares)
    if (!(s > 0)) return absl::InvalidArgumentError(absl::StrCat("share ", s, " is not positive"));
  for (int k : o.clients)
    if (k < 1 || k > 64)
      return absl::InvalidArgumentError(absl::StrCat("client count ", k, " is outside 1 ... 64"));
  if (o.seconds < 1 || o.window_ms <= 0)
    return absl::InvalidArgumentError("multitenant bench: at least 1 s, and a positive window");
  char tmpl[] = "/tmp/pw-bench-multitenant.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("cannot make a directory");
  const std::string dir = tmpl;
  absl::Cleanup remove = [&] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  };
  std::string address = o.cluster;
  std::optional<server::LocalClusterState> started;
  std::string saved_state;
  if (address.empty()) {
    const char* old = std::getenv("PW_STATE_DIR");
    saved_state = old == nullptr ? "" : old;
    setenv("PW_STATE_DIR", (dir + "/cluster").c_str(), 1);
    std::filesystem::create_directories(dir + "/cluster");
    PW_ASSIGN_OR_RETURN(started, StartCluster(o));
    address = started->address;
  }
  absl::Cleanup stop = [&] {
    if (!started.has_value()) return;
    (void)server::StopLocalCluster(*started);
    if (saved_state.empty()) unsetenv("PW_STATE_DIR");
    else setenv("PW_STATE_DIR", saved_state.c_str(), 1);
  };
  const char* token = std::getenv("PW_TOKEN");
  PW_ASSIGN_OR_RETURN(auto remote,
                      rpc::RemoteController::Dial(address, {.token = token ? token : ""}));
  PW_ASSIGN_OR_RETURN(const int devices, IslandDevices(*remote));
  const int64_t window = static_cast<int64_t>(o.window_ms * 1e6);
  const int64_t seconds = static_cast<int64_t>(o.seconds * 1e9);
  const int64_t lead = 3'000'000'000;  // Clients connect, compile and warm up meanwhile.
  std::vector<MultitenantBenchResult> results;
  int run = 0;
  // One client alone: its calls/s, and how busy it kept the devices (as device_busy).
  struct Alone {
    double per_second = 0, device_busy = 0;
  };
  auto run_alone = [&](double compute) -> absl::StatusOr<Alone> {
    std::vector<TenantProcess> alone = {{absl::StrCat("alone", run++), 1}};
    const int64_t start = NowNs() + lead;
    DeviceTimeSampler sampler(remote.get(), window, start + seconds);
    absl::Status ran = RunClients(o, address, dir, compute, start, start + seconds, 0, alone);
    std::vector<DeviceTimeSampler::Sample> samples = sampler.Take();
    PW_RETURN_IF_ERROR(ran);
    Alone a;
    a.per_second = CountIn(alone, start, start + seconds) / o.seconds;
    a.device_busy = DeviceBusy(samples, start, start + seconds, devices);
    std::fprintf(stderr, "multitenant bench: %.3g ms, 1 client: %.0f calls/s, devices measured "
                 "busy %.2f\n", compute, a.per_second, a.device_busy);
    return a;
  };
  for (double compute : o.compute_ms) {
    // The baseline of each K clients' run is one client alone just before it and just after it
    // (their mean), so a drift of this shared machine's speed over the runs hits both sides.
    PW_ASSIGN_OR_RETURN(Alone before, run_alone(compute));
    for (int k : o.clients) {
      std::vector<TenantProcess> clients;
      double total_share = 0;
      for (int i = 0; i < k; ++i) {
        clients.push_back({absl::StrCat("t", run, "-", i), o.shares[i % o.shares.size()]});
        total_share += clients.back().share;
      }
      ++run;
      const int64_t start = NowNs() + lead;
      const int64_t end = start + seconds;
      const int64_t join = o.late_join && k > 1 ? start + seconds / 2 : 0;
      // Samples at a fifth of a window, so windows (from a sample to the first one a window later)
      // are close to a window long.
      DeviceTimeSampler sampler(remote.get(), window / 5, end + window);
      absl::Status ran = RunClients(o, address, dir, compute, start, end, join, clients);
      std::vector<DeviceTimeSampler::Sample> samples = sampler.Take();
      PW_RETURN_IF_ERROR(ran);
      PW_ASSIGN_OR_RETURN(const Alone after, run_alone(compute));
      const double single = (before.per_second + after.per_second) / 2;
      MultitenantBenchResult r;
      r.clients = k;
      r.compute_ms = compute;
      r.single_client_per_second = single;
      r.single_client_before = before.per_second;
      r.single_client_after = after.per_second;
      r.single_utilization = single * compute / 1000;
      r.single_device_busy = (before.device_busy + after.device_busy) / 2;
      before = after;
      // Shares over the part every client ran (after the join, if one joined late); windows
      // after the first.
      const int64_t from = join > 0 ? join : start;
      r.aggregate_per_second = CountIn(clients, start, end) / o.seconds;
      r.utilization = r.aggregate_per_second * compute / 1000;
      // The samples within [from, end]: shares of device time over it, and per window between
      // successive samples (after the first window).
      std::vector<const DeviceTimeSampler::Sample*> span;
      for (const auto& x : samples)
        if (x.at >= from && x.at <= end) span.push_back(&x);
      if (span.size() < 3)
        return absl::InternalError(
            "multitenant bench: too few samples of the tenants' device time");
      r.device_busy = DeviceBusy(samples, from, end, devices);
      // Windows after the first, each from one sample to the first at least a window later (a
      // sample the loaded machine took late would otherwise leave a short window behind it).
      std::vector<std::pair<const DeviceTimeSampler::Sample*, const DeviceTimeSampler::Sample*>>
          windows;
      size_t first = 1;
      while (first < span.size() && span[first]->at - span[0]->at < window) ++first;
      for (size_t a = first, b = first + 1; b < span.size(); ++b) {
        if (span[b]->at - span[a]->at < window) continue;
        windows.emplace_back(span[a], span[b]);
        a = b;
      }
      for (const TenantProcess& c : clients) {
        MultitenantBenchResult::Share s;
        s.tenant = c.tenant;
        s.configured = c.share / total_share;
        s.calls = CountIn(c, from, end);
        auto [mine, all] = Between(*span.front(), *span.back(), c.client);
        s.achieved = all > 0 ? mine / all : 0;
        s.worst_window = s.achieved;
        for (const auto& [wa, wb] : windows) {
          auto [w_mine, w_all] = Between(*wa, *wb, c.client);
          if (w_all <= 0) continue;
          const double got = w_mine / w_all;
          if (std::abs(got - s.configured) > std::abs(s.worst_window - s.configured))
            s.worst_window = got;
        }
        r.shares.push_back(s);
      }
      if (join > 0) {
        // The first window after the joiner's first call finished: its share and the others'.
        r.joined_at_seconds = (join - start) / 1e9;
        const TenantProcess& joiner = clients.back();
        auto first_done = std::lower_bound(joiner.done.begin(), joiner.done.end(), join);
        const int64_t first = first_done != joiner.done.end() ? *first_done : join;
        auto a = std::find_if(samples.begin(), samples.end(),
                              [&](const auto& x) { return x.at >= first; });
        auto b = a == samples.end()
                     ? a
                     : std::find_if(a, samples.end(),
                                    [&](const auto& x) { return x.at >= a->at + window; });
        if (b != samples.end()) {
          r.others_least_in_joiners_first_window = 1e9;
          for (size_t i = 0; i < clients.size(); ++i) {
            auto [mine, all] = Between(*a, *b, clients[i].client);
            const double of_configured = all > 0 ? mine / all / r.shares[i].configured : 0;
            if (i + 1 == clients.size()) r.joiner_first_window = of_configured;
            else r.others_least_in_joiners_first_window =
                std::min(r.others_least_in_joiners_first_window, of_configured);
          }
        }
      }
      std::fprintf(stderr, "multitenant bench: %.3g ms, %d clients: %.0f calls/s (%.2fx one), "
                           "utilization %.2f, devices measured busy %.2f (one client: %.2f)\n",
                   compute, k, r.aggregate_per_second, r.aggregate_per_second / single,
                   r.utilization, r.device_busy, r.single_device_busy);
      for (const auto& s : r.shares)
        std::fprintf(stderr, "  %-10s configured %.3f achieved %.3f worst window %.3f\n",
                     s.tenant.c_str(), s.configured, s.achieved, s.worst_window);
      results.push_back(std::move(r));
    }
  }
  return results;
}

std::string MultitenantBenchJson(const std::vector<MultitenantBenchResult>& results) {
  nlohmann::json j;
  j["results"] = nlohmann::json::array();
  for (const MultitenantBenchResult& r : results) {
    nlohmann::json x = {{"clients", r.clients},
                        {"compute_ms", r.compute_ms},
                        {"aggregate_per_second", r.aggregate_per_second},
                        {"single_client_per_second", r.single_client_per_second},
                        {"single_client_per_second_before", r.single_client_before},
                        {"single_client_per_second_after", r.single_client_after},
                        {"utilization", r.utilization},
                        {"single_utilization", r.single_utilization},
                        {"device_busy", r.device_busy},
                        {"single_device_busy", r.single_device_busy},
                        {"shares", nlohmann::json::array()}};
    for (const auto& s : r.shares)
      x["shares"].push_back({{"tenant", s.tenant}, {"configured", s.configured},
                             {"achieved", s.achieved}, {"worst_window", s.worst_window},
                             {"calls", s.calls}});
    if (r.joined_at_seconds > 0) {
      x["late_join"] = {{"joined_at_seconds", r.joined_at_seconds},
                        {"joiner_first_window_of_configured", r.joiner_first_window},
                        {"others_least_of_configured", r.others_least_in_joiners_first_window}};
    }
    j["results"].push_back(std::move(x));
  }
  return j.dump();
}

}  // namespace pw
