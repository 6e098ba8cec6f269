// CPU binding for worker processes: a local cluster (`pw up`) gives each host its own cores, as
// separate machines would have, so one host's device threads do not take turns with another's.
//
// Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pw::server {

// "0-3,6" -> {0, 1, 2, 3, 6}: sorted, without repeats. INVALID_ARGUMENT names the bad part.
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list);
// The inverse: {0, 1, 2, 3, 6} -> "0-3,6".
std::string FormatCpuList(absl::Span<const int> cpus);
// The CPUs the calling thread may run on.
absl::StatusOr<std::vector<int>> AllowedCpus();
// Binds every thread of this process, and the threads started afterwards, to `cpus`; each must
// be one the calling thread may run on now (FAILED_PRECONDITION names those that are not). Call
// it before starting threads where possible (pw worker does).
absl::Status BindProcessToCpus(absl::Span<const int> cpus);
// Splits `cpus` among `hosts` hosts in order. With at least as many CPUs as hosts, each gets a
// block of its own (sizes differ by at most one); with fewer, consecutive hosts (an island's
// neighbours) share one.
std::vector<std::vector<int>> SplitCpus(absl::Span<const int> cpus, int hosts);

}  // namespace pw::server
