// The round-trip time of a 1-byte message over a TCP connection on loopback: the yardstick for
// per-node dispatch overhead on a multi-process cluster (measured in the same run).
#pragma once

#include "absl/status/statusor.h"

namespace pw {

// Median of `rounds` ping-pongs between this thread and an echo thread, in microseconds.
absl::StatusOr<double> MeasureLoopbackRttUs(int rounds = 2000);

}  // namespace pw
