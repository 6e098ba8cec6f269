#include "pw/base/heap.h"

#include <malloc.h>

#include <atomic>
#include <cstdio>

#include "gperftools/malloc_extension_c.h"

// Weak: defined only where tcmalloc is linked in (the pw binary); elsewhere (the Python extension
// in a Python process) glibc's malloc_trim gives memory back instead.
#pragma weak MallocExtension_ReleaseFreeMemory
#pragma weak MallocExtension_SetNumericProperty

namespace pw {
namespace {
std::atomic<int64_t> transient_bytes{0};
// Releases still to do: a large buffer counted while its call runs is freed a little later (when
// gRPC finishes the call), so the release repeats on the next few ticks.
std::atomic<int> releases_left{0};
constexpr int kReleases = 5;
std::atomic<int64_t> last_release_ns{0};  // absl::ToUnixNanos of the last release; 0: none yet.
}  // namespace

void CountTransientBytes(int64_t bytes) {
  if (bytes > 0) transient_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

bool ReleaseFreeMemoryIfDue(absl::Time now, int64_t threshold) {
  if (transient_bytes.load(std::memory_order_relaxed) >= threshold) {
    transient_bytes.store(0, std::memory_order_relaxed);
    releases_left.store(kReleases, std::memory_order_relaxed);
  }
  const int64_t now_ns = absl::ToUnixNanos(now);
  int64_t last = last_release_ns.load(std::memory_order_relaxed);
  if (last == 0) {  // The interval starts at the first call.
    last_release_ns.compare_exchange_strong(last, now_ns, std::memory_order_relaxed);
    last = last_release_ns.load(std::memory_order_relaxed);
  }
  if (releases_left.load(std::memory_order_relaxed) > 0) {
    releases_left.fetch_sub(1, std::memory_order_relaxed);
  } else if (now_ns - last < absl::ToInt64Nanoseconds(kReleaseInterval)) {
    return false;
  }
  last_release_ns.store(now_ns, std::memory_order_relaxed);
  if (&MallocExtension_ReleaseFreeMemory != nullptr) {
    MallocExtension_ReleaseFreeMemory();
  } else {
    malloc_trim(0);
  }
  return true;
}

bool LimitThreadCaches(int64_t bytes) {
  if (&MallocExtension_SetNumericProperty == nullptr || bytes <= 0) return false;
  return MallocExtension_SetNumericProperty("tcmalloc.max_total_thread_cache_bytes",
                                            static_cast<size_t>(bytes)) != 0;
}

ResidentMemory ReadResidentMemory() {
  ResidentMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long kib = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) m.now = kib * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) m.peak = kib * 1024;
  }
  std::fclose(f);
  return m;
}

bool ResetPeakResidentMemory() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace pw
