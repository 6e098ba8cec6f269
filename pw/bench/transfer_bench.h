// `pw bench transfer`: throughput of the worker-to-worker data plane, beside the raw path it
// runs on, measured in the same run.
//
// RunTransferBench: a worker process (in this process, served over gRPC on loopback) holds a
// shard; a peer fetches it with the same call a transfer node uses (RemoteWorker::FetchShard).
// ICI: a peer on the same machine (shared memory), beside memcpy. DCN: a peer on another machine
// (a TCP stream), beside raw TCP on loopback (one connection, write/read of the same size).
// RunTransferBenchOn (`--cluster`): between the hosts of a running cluster, through a client.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/transport/controller_interface.h"

namespace pw {

struct TransferBenchOptions {
  std::vector<int64_t> sizes;  // Bytes; default 1 KiB ... 256 MiB in powers of 4.
  double min_seconds = 0.2;    // Per measurement, over all rounds.
  int rounds = 3;              // Interleaved rounds; each measurement keeps its best.
  int min_iterations = 3;
};

struct TransferBenchResult {
  std::string path;      // "ici" | "dcn"
  std::string baseline;  // "memcpy" | "tcp" | "resident" (cluster runs)
  int64_t bytes = 0;
  double pathways_bytes_per_second = 0;
  double baseline_bytes_per_second = 0;
  double ratio = 0;  // pathways / baseline
  // Cluster runs (RunTransferBenchOn): bytes this path moved, and what the workers counted on
  // its link (ICI or DCN) meanwhile; -1 elsewhere.
  int64_t moved_bytes = -1;
  int64_t counted_bytes = -1;
};

absl::StatusOr<std::vector<TransferBenchResult>> RunTransferBench(const TransferBenchOptions& o);
// On a running cluster, through a client: a one-device `copy` reads an array that a device on
// another island (DCN), or on another host of the same island (ICI), holds; the baseline
// ("resident") is the same call with the array already on its device. Default sizes 1 KiB ...
// 16 MiB. Needs the cluster to itself for the byte counts to match.
absl::StatusOr<std::vector<TransferBenchResult>> RunTransferBenchOn(ControllerInterface* controller,
                                                                    const TransferBenchOptions& o);
std::string TransferBenchJson(const std::vector<TransferBenchResult>& results);

}  // namespace pw
