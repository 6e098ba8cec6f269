#include "pw/base/heap.h"

#include <malloc.h>

#include <atomic>

#include "gperftools/malloc_extension_c.h"

// Weak: defined only where tcmalloc is linked in (the pw binary); elsewhere (the Python extension
// in a Python process) glibc's malloc_trim gives memory back instead.
#pragma weak MallocExtension_ReleaseFreeMemory

namespace pw {
namespace {
std::atomic<int64_t> transient_bytes{0};
// Releases still to do: a large buffer counted while its call runs is freed a little later (when
// gRPC finishes the call), so the release repeats on the next few ticks.
std::atomic<int> releases_left{0};
constexpr int kReleases = 5;
}  // namespace

void CountTransientBytes(int64_t bytes) {
  if (bytes > 0) transient_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

bool ReleaseFreeMemoryAfterTransients(int64_t threshold) {
  if (transient_bytes.load(std::memory_order_relaxed) >= threshold) {
    transient_bytes.store(0, std::memory_order_relaxed);
    releases_left.store(kReleases, std::memory_order_relaxed);
  }
  if (releases_left.load(std::memory_order_relaxed) <= 0) return false;
  releases_left.fetch_sub(1, std::memory_order_relaxed);
  if (&MallocExtension_ReleaseFreeMemory != nullptr) {
    MallocExtension_ReleaseFreeMemory();
  } else {
    malloc_trim(0);
  }
  return true;
}

}  // namespace pw
