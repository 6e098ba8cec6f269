#include "pw/bench/transfer_bench.h"


#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "pw/base/status_macros.h"
#include "pw/bench/raw_tcp.h"
#include "pw/client/client.h"
#include "pw/rpc/remote_worker.h"
#include "pw/server/controller_server.h"
#include "pw/server/worker_server.h"

namespace pw {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes per second of `op` over `seconds` (at least min_iterations calls).
absl::StatusOr<double> Rate(int64_t bytes, const TransferBenchOptions& o, double seconds,
                            const std::function<absl::Status()>& op) {
  int n = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (n < o.min_iterations || elapsed < seconds) {
    PW_RETURN_IF_ERROR(op());
    ++n;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return static_cast<double>(bytes) * n / elapsed;
}

absl::Status CheckSizes(const std::vector<int64_t>& sizes) {
  for (int64_t s : sizes)
    if (s <= 0 || s % 4 != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("transfer size ", s, " is not a positive multiple of 4"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TransferBenchResult>> RunTransferBench(const TransferBenchOptions& opts) {
  TransferBenchOptions o = opts;
  if (o.sizes.empty())
    for (int64_t s = 1024; s <= (int64_t{256} << 20); s *= 4) o.sizes.push_back(s);
  PW_RETURN_IF_ERROR(CheckSizes(o.sizes));
  const int64_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  // One host with one device whose memory holds the largest shard.
  PW_ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::Uniform(1, 1, 1, 2 * largest + (1 << 20)));
  // A bench of one host: a stall of a loaded machine must not fail it.
  PW_ASSIGN_OR_RETURN(auto controller,
                      server::ControllerServer::Start(spec, {.failure_timeout = absl::Minutes(1)}));
  // The readers are peers, so they present the cluster token as workers do.
  const rpc::ChannelOptions peer{.token = controller->cluster_token()};
  PW_ASSIGN_OR_RETURN(auto worker,
                      server::WorkerServer::Start(
                          {.controller = controller->address(), .host = HostId(0), .channel = peer}));
  // Readers: a peer on this machine (shared memory) and one on another (TCP stream).
  rpc::RemoteWorker ici(HostId(0), worker->address(), peer, /*same_machine=*/true);
  rpc::RemoteWorker dcn(HostId(0), worker->address(), peer, /*same_machine=*/false);
  RawTcp tcp;
  PW_RETURN_IF_ERROR(tcp.Open());

  std::vector<TransferBenchResult> results;
  int64_t next_buffer = 1;
  for (int64_t size : o.sizes) {
    const BufferId id(next_buffer++);
    HostArray shard{{DType::kF32, Shape({size / 4})}, Bytes(size)};
    for (int64_t i = 0; i < size; ++i) shard.bytes[i] = static_cast<uint8_t>(i * 131);
    PW_RETURN_IF_ERROR(ici.PutShard(id, DeviceId(0), shard).Await());
    auto fetch = [&](rpc::RemoteWorker& via) -> absl::Status {
      PW_ASSIGN_OR_RETURN(DeviceBufferRef b, via.FetchShard(id, DeviceId(0)).Await());
      if (b->size_bytes() != size) return absl::InternalError("fetched the wrong size");
      const auto* h = static_cast<const HostDeviceBuffer*>(b.get());
      if (std::memcmp(h->data(), shard.bytes.data(), 64 < size ? 64 : size) != 0)
        return absl::DataLossError("fetched bytes differ");
      return absl::OkStatus();
    };
    std::vector<char> src(size, 1), dst(size);
    // Each path and its baseline in interleaved rounds (noise on this shared machine hits them
    // alike); each keeps its best round.
    const std::function<absl::Status()> ops[] = {
        [&] { return fetch(ici); },
        [&] {
          std::memcpy(dst.data(), src.data(), size);
          return absl::OkStatus();
        },
        [&] { return fetch(dcn); },
        [&] { return tcp.Send(src); }};
    double best[4] = {0, 0, 0, 0};
    for (const auto& op : ops) PW_RETURN_IF_ERROR(op());  // Warm.
    const int rounds = std::max(1, o.rounds);
    for (int round = 0; round < rounds; ++round) {
      for (int i = 0; i < 4; ++i) {
        PW_ASSIGN_OR_RETURN(double r, Rate(size, o, o.min_seconds / rounds, ops[i]));
        best[i] = std::max(best[i], r);
      }
    }
    const double ici_rate = best[0], memcpy_rate = best[1], dcn_rate = best[2], tcp_rate = best[3];
    results.push_back({"ici", "memcpy", size, ici_rate, memcpy_rate, ici_rate / memcpy_rate});
    results.push_back({"dcn", "tcp", size, dcn_rate, tcp_rate, dcn_rate / tcp_rate});
    std::fprintf(stderr, "transfer bench: %10lld B  ici %8.1f MB/s (memcpy %8.1f)  dcn %8.1f MB/s (tcp %8.1f)\n",
                 (long long)size, ici_rate / 1e6, memcpy_rate / 1e6, dcn_rate / 1e6, tcp_rate / 1e6);
    ici.DeleteBuffers({id});
  }
  return results;
}

absl::StatusOr<std::vector<TransferBenchResult>> RunTransferBenchOn(
    ControllerInterface* controller, const TransferBenchOptions& opts) {
  TransferBenchOptions o = opts;
  if (o.sizes.empty())
    for (int64_t s = 1024; s <= (int64_t{16} << 20); s *= 4) o.sizes.push_back(s);
  PW_RETURN_IF_ERROR(CheckSizes(o.sizes));
  PW_ASSIGN_OR_RETURN(auto client, Client::Connect(controller, "transfer-bench"));
  // One-device slices until one is on another island than the first and one on another host of
  // the first's island: the resource manager gives each to the least-loaded island, then device.
  // All stay allocated until the client goes, so each lands on a device not yet used.
  PW_ASSIGN_OR_RETURN(const ClusterStatus status, StatusOfEveryHost(*controller));
  int alive = 0;
  for (const HostStatus& h : status.hosts)
    for (const DeviceStatus& d : h.devices) alive += d.alive;
  std::optional<Slice> src, dcn_dst, ici_dst;
  for (int i = 0; i < alive && !(src && dcn_dst && ici_dst); ++i) {
    PW_ASSIGN_OR_RETURN(Slice s, client->MakeVirtualDeviceSet().AddSlice({.num_devices = 1}));
    if (!src) {
      src = s;
    } else if (s.info().islands != src->info().islands) {
      if (!dcn_dst) dcn_dst = s;
    } else if (s.info().hosts != src->info().hosts) {
      if (!ici_dst) ici_dst = s;
    }
  }
  if (!dcn_dst && !ici_dst)
    return absl::FailedPreconditionError(
        "transfer bench: the cluster has no live device on another host than its first");
  struct Path {
    const char* name;
    bool dcn;  // Which link counter its bytes land in.
    const std::optional<Slice>& dst;
  };
  std::vector<TransferBenchResult> results;
  for (int64_t size : o.sizes) {
    const int64_t n = size / 4;
    NativeFunctionBuilder b(absl::StrCat("copy_", n));
    const int x = b.Input({DType::kF32, Shape({n})});
    PW_ASSIGN_OR_RETURN(FunctionInfo copy_fn, client->Register(b.Build({b.Op("copy", {x})})));
    HostArray host{{DType::kF32, Shape({1, n})}, Bytes(size)};
    for (int64_t i = 0; i < size; ++i) host.bytes[i] = static_cast<uint8_t>(i * 131);
    const Sharding one = Sharding::Split({1}, 2, 0);
    PW_ASSIGN_OR_RETURN(Array at_src, client->Put(host, src->info().id, one));
    for (const Path& path : {Path{"ici", false, ici_dst}, Path{"dcn", true, dcn_dst}}) {
      if (!path.dst) continue;
      PW_ASSIGN_OR_RETURN(BoundFunction copy, client->Pmap(copy_fn, *path.dst));
      PW_ASSIGN_OR_RETURN(Array resident, client->Put(host, path.dst->info().id, one));
      int64_t moved = 0;
      auto run = [&](const Array& in, bool remote) -> absl::Status {
        PW_ASSIGN_OR_RETURN(auto outs, copy.Call({in}));
        PW_RETURN_IF_ERROR(outs[0].Ready().status());
        moved += remote ? size : 0;
        return absl::OkStatus();
      };
      PW_ASSIGN_OR_RETURN(const LinkBytes before, ReceivedBytes(*controller));
      {  // Warm, and check what arrived.
        PW_ASSIGN_OR_RETURN(auto outs, copy.Call({at_src}));
        PW_ASSIGN_OR_RETURN(HostArray got, outs[0].ToHost());
        if (got.bytes != host.bytes)
          return absl::DataLossError(absl::StrCat("transfer bench: ", path.name, " ", size,
                                                  " B arrived different"));
        moved += size;
        PW_RETURN_IF_ERROR(run(resident, false));
      }
      // The path and its baseline in interleaved rounds; each keeps its best round.
      double best = 0, best_resident = 0;
      const int rounds = std::max(1, o.rounds);
      for (int round = 0; round < rounds; ++round) {
        PW_ASSIGN_OR_RETURN(double r, Rate(size, o, o.min_seconds / rounds,
                                           [&] { return run(at_src, true); }));
        PW_ASSIGN_OR_RETURN(double l, Rate(size, o, o.min_seconds / rounds,
                                           [&] { return run(resident, false); }));
        best = std::max(best, r);
        best_resident = std::max(best_resident, l);
      }
      PW_ASSIGN_OR_RETURN(const LinkBytes after, ReceivedBytes(*controller));
      TransferBenchResult r{path.name, "resident", size, best, best_resident, best / best_resident};
      r.moved_bytes = moved;
      r.counted_bytes = path.dcn ? after.dcn - before.dcn : after.ici - before.ici;
      std::fprintf(stderr,
                   "transfer bench: %10lld B  %s %8.1f MB/s (resident %8.1f)  moved %lld B, "
                   "counted %lld B\n",
                   (long long)size, path.name, best / 1e6, best_resident / 1e6, (long long)moved,
                   (long long)r.counted_bytes);
      results.push_back(r);
    }
  }
  return results;
}

std::string TransferBenchJson(const std::vector<TransferBenchResult>& results) {
  nlohmann::json j;
  j["results"] = nlohmann::json::array();
  j["statistic"] = "best of interleaved rounds";
  for (const auto& r : results) {
    j["results"].push_back({{"path", r.path},
                            {"baseline", r.baseline},
                            {"bytes", r.bytes},
                            {"pathways_bytes_per_second", r.pathways_bytes_per_second},
                            {"baseline_bytes_per_second", r.baseline_bytes_per_second},
                            {"ratio", r.ratio}});
    if (r.moved_bytes >= 0) {
      j["results"].back()["moved_bytes"] = r.moved_bytes;
      j["results"].back()["counted_bytes"] = r.counted_bytes;
    }
  }
  return j.dump(2);
}

}  // namespace pw
