// `pw bench collectives`: all-reduce across worker processes (pw/executor/collectives.h), beside
// memcpy and raw loopback TCP measured in the same run.
//
// For each process count P it starts a local cluster of P worker processes with one device each
// (as `pw up --islands 1 --hosts-per-island P --devices-per-host 1` would, in a state directory
// of its own), and times a native all_reduce_sum of B bytes per shard: one node holding K
// all-reduces in a row, K chosen so a run takes a few milliseconds or more, so the time per
// all-reduce leaves the per-run overhead out. bus_gbps is B * 2 (P - 1) / P / seconds / 1e9 (the
// bytes each process must move at least, as NCCL reports it). With `baseline`, the same
// all-reduces with the kernel's `algorithm` attribute set to broadcast (the one-round algorithm
// every collective used before) are timed on the same cluster, in rounds interleaved with the
// others, so the gain is a ratio measured in one run.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pw {

struct CollectivesBenchOptions {
  std::string pw_binary;                   // The `pw` executable that runs the workers.
  std::vector<int> processes = {2, 4, 8};
  std::vector<int64_t> sizes;              // Bytes per shard (multiples of 4); default 8 ... 64 MiB.
  double min_seconds = 0.2;                // Per measurement.
  bool baseline = false;
};

struct CollectivesBenchResult {
  int processes = 0;
  int64_t bytes = 0;
  std::string algorithm;  // "auto" (this runtime's choice) or "broadcast" (the baseline).
  double seconds = 0;     // Per all-reduce.
  double bus_gbps = 0;
  double memcpy_gbps = 0;
  double tcp_gbps = 0;
};

absl::StatusOr<std::vector<CollectivesBenchResult>> RunCollectivesBench(
    const CollectivesBenchOptions& options);
// {"results": [{"processes", "bytes", "algorithm", "seconds", "bus_gbps", "memcpy_gbps",
// "tcp_gbps"}, ...]}
std::string CollectivesBenchJson(const std::vector<CollectivesBenchResult>& results);

}  // namespace pw
