// Giving the allocator's free memory back to the system after large transient buffers.
//
// The allocator (tcmalloc in the `pw` binary, glibc malloc elsewhere) keeps freed pages for
// reuse. After a message of hundreds of MiB (a put, a fetch, a shard on the wire: gRPC slices,
// protobuf strings, copies), that is gigabytes that stay with the process though nothing holds
// them. Code that handles such buffers counts their bytes; a periodic thread (the controller's
// monitor, the worker's heartbeat), once the buffers have been freed, releases the free memory if
// enough passed through since the last release, and otherwise every kReleaseInterval (pages
// freed by steady churn come back too). Releasing costs page faults when memory is reused, so it
// happens after large transients and on that interval, never per message.
//
// tcmalloc's per-thread caches grow towards 32 MiB in all by default; in a process whose live
// heap is small (the controller's is about 1.5 MiB) that growth is most of its memory over time.
// LimitThreadCaches caps them. Thread-safe.
#pragma once

#include <cstdint>

#include "absl/time/time.h"

namespace pw {

inline constexpr int64_t kReleaseAfterTransientBytes = int64_t{64} << 20;

// Counts `bytes` of a transient buffer (one that is freed once its call ends).
void CountTransientBytes(int64_t bytes);
inline constexpr absl::Duration kReleaseInterval = absl::Seconds(10);

// Called periodically (`now`: the caller's clock): gives the allocator's free memory back to the
// system once at least `threshold` transient bytes were counted, on this call and the next few
// (the buffers are freed when their calls end, a little after they were counted), and otherwise
// when kReleaseInterval has passed since the last release; returns whether it did.
bool ReleaseFreeMemoryIfDue(absl::Time now, int64_t threshold = kReleaseAfterTransientBytes);
// Caps the allocator's per-thread caches at `bytes` in all (tcmalloc only; returns whether it
// applied). For processes whose live heap is small.
bool LimitThreadCaches(int64_t bytes);

// This process's resident memory (/proc/self/status VmRSS) and its peak (VmHWM); zeros where
// it cannot be read.
struct ResidentMemory {
  int64_t now = 0;
  int64_t peak = 0;
};
ResidentMemory ReadResidentMemory();
// Resets the peak to the current resident memory (/proc/self/clear_refs); false if it cannot.
bool ResetPeakResidentMemory();

}  // namespace pw
