// `pw bench io`: a client's put and get throughput on a running cluster, beside raw TCP on
// loopback measured in the same run, and how much the controller's resident memory grows
// meanwhile (client I/O goes beside the controller: ControllerInterface::BeginPut).
//
// Each array is split along its leading dimension over a slice of two devices (one host when
// the cluster has two devices per host); the baseline sends the same bytes on one loopback TCP
// connection (RawTcp). A put counts until the array is ready on its devices; a get until the
// whole array is in the client's memory. Each figure is the steady state: the first put and get
// of each size are timed apart, as first_call_gbps, since they mostly measure the first touch of
// fresh memory (the baseline's first call is left out too).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/rpc/remote_controller.h"

namespace pw {

struct IoBenchOptions {
  std::vector<int64_t> sizes;  // Bytes (multiples of 8); default 1 KiB ... 1 GiB in powers of 4.
  double min_seconds = 0.2;    // Per measurement.
  int min_iterations = 2;
  // Needs the cluster token (resetting the controller's peak memory is the admin's).
  bool measure_controller_memory = true;
};

struct IoBenchResult {
  std::string op;  // "put" | "get"
  int64_t bytes = 0;
  double gbps = 0;          // 1e9 bytes per second.
  double raw_tcp_gbps = 0;  // The same bytes on one loopback TCP connection.
  double ratio = 0;         // gbps / raw_tcp_gbps
  // The controller's peak resident memory while these ran minus its memory before (its peak is
  // reset as they start; where the kernel does not allow that, an earlier peak may count).
  // None when not measured (JSON null).
  std::optional<int64_t> controller_rss_growth_bytes;
  double first_call_gbps = 0;  // The size's first call alone (cold memory), not in `gbps`.
};

absl::StatusOr<std::vector<IoBenchResult>> RunIoBench(rpc::RemoteController* controller,
                                                      const IoBenchOptions& o);
std::string IoBenchJson(const std::vector<IoBenchResult>& results);

}  // namespace pw
