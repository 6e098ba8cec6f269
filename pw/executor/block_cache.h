// BlockCache: freed large host blocks kept for the next allocation of the same size.
//
// On the machines this runs on (VMs), memory a process touches for the first time costs more
// than copying into it: the kernel zeroes each fresh page as the hypervisor backs it (measured:
// 16-64 MiB client puts at 0.2 GB/s into fresh memory, 3.5-4.5 GB/s into reused memory), and the
// allocator hands memory back to the system as it likes. Shards of one shape are made again every
// step (puts, transfers, outputs), so, as an accelerator runtime's caching allocator does, the
// native backend keeps its freed large blocks, by size, up to a limit (1 GiB a process), and
// frees blocks unused for `max_idle` (10 s).
//
// Under ASan a cached block is poisoned until it is taken again, so a use of a freed shard's
// bytes is still caught. Thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>

#include "absl/time/time.h"
#include "pw/base/mutex.h"
#include "pw/trace/trace.h"

namespace pw {

class BlockCache {
 public:
  struct Options {
    size_t max_bytes = size_t{1} << 30;  // Cached at once.
    absl::Duration max_idle = absl::Seconds(10);
    std::function<int64_t()> now_ns = [] { return trace::Now(); };  // Monotonic.
  };
  explicit BlockCache(Options options) : options_(std::move(options)) {}
  ~BlockCache();  // Frees what it holds.
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A cached block of exactly `bytes` (the most recently kept), or null.
  void* Take(size_t bytes);
  // Keeps `block` (from std::aligned_alloc or posix_memalign) of `bytes`, or frees it if it
  // alone is over the limit; frees the oldest blocks over the limit and those idle too long.
  void Keep(void* block, size_t bytes);
  // Frees the blocks idle too long (Take and Keep do too): for a process that may go idle
  // (pw/server's workers, on each heartbeat).
  void Trim();
  size_t cached_bytes() const;

  // The native backend's (HostDeviceBuffer's) cache, for blocks of at least 2 MiB.
  static BlockCache& ForHostBuffers();

 private:
  struct Block {
    void* data;
    size_t bytes;
    int64_t kept_ns;
  };
  // Frees blocks idle since before `now_ns` - max_idle, and the oldest while over the limit.
  void TrimLocked(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable pw::Mutex mu_;
  std::deque<Block> blocks_ ABSL_GUARDED_BY(mu_);  // Oldest first.
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pw
