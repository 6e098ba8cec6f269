#include "pw/executor/block_cache.h"

#include <cstdlib>

namespace pw {

BlockCache::~BlockCache() {
  pw::MutexLock lock(&mu_);
  for (const Block& b : blocks_) std::free(b.data);
}

void* BlockCache::Take(size_t bytes) {
  pw::MutexLock lock(&mu_);
  TrimLocked(options_.now());
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    if (it->bytes != bytes) continue;
    void* data = it->data;
    blocks_.erase(std::next(it).base());
    bytes_ -= bytes;
    return data;
  }
  return nullptr;
}

void BlockCache::Keep(void* block, size_t bytes) {
  if (bytes > options_.max_bytes) return std::free(block);
  pw::MutexLock lock(&mu_);
  const absl::Time now = options_.now();
  blocks_.push_back({block, bytes, now});
  bytes_ += bytes;
  TrimLocked(now);
}

void BlockCache::Trim() {
  pw::MutexLock lock(&mu_);
  TrimLocked(options_.now());
}

size_t BlockCache::cached_bytes() const {
  pw::MutexLock lock(&mu_);
  return bytes_;
}

void BlockCache::TrimLocked(absl::Time now) {
  while (!blocks_.empty() &&
         (bytes_ > options_.max_bytes || now - blocks_.front().kept > options_.max_idle)) {
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
