// Giving the allocator's free memory back to the system after large transient buffers.
//
// The allocator (tcmalloc in the `pw` binary, glibc malloc elsewhere) keeps freed pages for
// reuse. After a message of hundreds of MiB (a put, a fetch, a shard on the wire: gRPC slices,
// protobuf strings, copies), that is gigabytes that stay with the process though nothing holds
// them. Code that handles such buffers counts their bytes; a periodic thread (the controller's
// monitor, the worker's heartbeat), once the buffers have been freed, releases the free memory if
// enough passed through since the last release. Releasing costs page faults when memory is
// reused, so it happens only after large transients, never per message. Thread-safe.
#pragma once

#include <cstdint>

namespace pw {

inline constexpr int64_t kReleaseAfterTransientBytes = int64_t{64} << 20;

// Counts `bytes` of a transient buffer (one that is freed once its call ends).
void CountTransientBytes(int64_t bytes);
// Called periodically: once at least `threshold` transient bytes were counted, gives the
// allocator's free memory back to the system on this call and the next few (the buffers are
// freed when their calls end, a little after they were counted); returns whether it did.
bool ReleaseFreeMemoryAfterTransients(int64_t threshold = kReleaseAfterTransientBytes);

}  // namespace pw
