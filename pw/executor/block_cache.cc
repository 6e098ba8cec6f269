#include "pw/executor/block_cache.h"

#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define PW_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define PW_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define PW_POISON(p, n) ((void)(p), (void)(n))
#define PW_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace pw {

BlockCache::~BlockCache() {
  pw::MutexLock lock(&mu_);
  for (const Block& b : blocks_) {
    PW_UNPOISON(b.data, b.bytes);
    std::free(b.data);
  }
}

void* BlockCache::Take(size_t bytes) {
  pw::MutexLock lock(&mu_);
  TrimLocked(options_.now_ns());
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    if (it->bytes != bytes) continue;
    void* data = it->data;
    blocks_.erase(std::next(it).base());
    bytes_ -= bytes;
    PW_UNPOISON(data, bytes);
    return data;
  }
  return nullptr;
}

void BlockCache::Keep(void* block, size_t bytes) {
  if (bytes > options_.max_bytes) return std::free(block);
  PW_POISON(block, bytes);
  pw::MutexLock lock(&mu_);
  const int64_t now = options_.now_ns();
  blocks_.push_back({block, bytes, now});
  bytes_ += bytes;
  TrimLocked(now);
}

void BlockCache::Trim() {
  pw::MutexLock lock(&mu_);
  TrimLocked(options_.now_ns());
}

size_t BlockCache::cached_bytes() const {
  pw::MutexLock lock(&mu_);
  return bytes_;
}

void BlockCache::TrimLocked(int64_t now_ns) {
  const int64_t max_idle_ns = absl::ToInt64Nanoseconds(options_.max_idle);
  while (!blocks_.empty() &&
         (bytes_ > options_.max_bytes || now_ns - blocks_.front().kept_ns > max_idle_ns)) {
    PW_UNPOISON(blocks_.front().data, blocks_.front().bytes);
    std::free(blocks_.front().data);
    bytes_ -= blocks_.front().bytes;
    blocks_.pop_front();
  }
}

BlockCache& BlockCache::ForHostBuffers() {
  static BlockCache* cache = new BlockCache(Options());  // Never destroyed: buffers outlive main.
  return *cache;
}

}  // namespace pw
