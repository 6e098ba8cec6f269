#include "pw/dataplane/shm_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pw::dataplane {

ShmArena::ShmArena(size_t max_segments, size_t max_bytes)
    : max_segments_(max_segments), max_bytes_(max_bytes) {}

ShmArena::~ShmArena() {
  pw::MutexLock lock(&mu_);
  for (const std::string& n : names_) shm_unlink(n.c_str());
}

std::shared_ptr<ShmSegment> ShmArena::Take() {
  pw::MutexLock lock(&mu_);
  if (free_.empty()) return nullptr;
  auto it = std::max_element(free_.begin(), free_.end(), [](const auto& a, const auto& b) {
    return a->capacity() < b->capacity();
  });
  std::shared_ptr<ShmSegment> s = std::move(*it);
  free_.erase(it);
  return s;
}

void ShmArena::Give(std::shared_ptr<ShmSegment> segment) {
  pw::MutexLock lock(&mu_);
  if (closed_) {
    bytes_ -= segment->capacity();
    Unlink(segment->name());
    return;  // Unmapped as `segment` goes.
  }
  free_.push_back(std::move(segment));
}

void ShmArena::Close() {
  std::vector<std::shared_ptr<ShmSegment>> dropped;  // Unmapped after the lock is released.
  pw::MutexLock lock(&mu_);
  closed_ = true;
  for (const auto& s : free_) {
    bytes_ -= s->capacity();
    Unlink(s->name());
  }
  dropped.swap(free_);
}

void ShmArena::Unlink(const std::string& name) {
  shm_unlink(name.c_str());
  names_.erase(std::remove(names_.begin(), names_.end(), name), names_.end());
}

void ShmArena::Discard(const std::shared_ptr<ShmSegment>& segment) {
  pw::MutexLock lock(&mu_);
  bytes_ -= segment->capacity();
  Unlink(segment->name());
}

absl::Status ShmArena::Grow(size_t size) {
  size_t capacity = size_t{1} << 20;
  while (capacity < size) capacity <<= 1;
  {
    pw::MutexLock lock(&mu_);
    if (closed_) return absl::FailedPreconditionError("shared-memory arena is closed");
    // Room: drop the smallest free segments while over a limit, but only those too small for
    // `size`. At the limit with free segments that fit, the pool stays as it is: the shard found
    // it empty because every segment was taken, and replacing a free one of the same size would
    // map and fault a new segment on every such transfer.
    std::sort(free_.begin(), free_.end(),
              [](const auto& a, const auto& b) { return a->capacity() > b->capacity(); });
    const auto over_limit = [&] {
      return names_.size() + 1 > max_segments_ || bytes_ + capacity > max_bytes_;
    };
    if (over_limit() && !free_.empty() && free_.front()->capacity() >= size)
      return absl::OkStatus();
    while (over_limit() && !free_.empty()) {
      bytes_ -= free_.back()->capacity();
      Unlink(free_.back()->name());
      free_.pop_back();
    }
    if (over_limit()) return absl::ResourceExhaustedError("shared-memory arena is full");
    bytes_ += capacity;  // Reserved; given back below on failure.
  }
  absl::StatusOr<std::shared_ptr<ShmSegment>> segment =
      ShmSegment::Create(ShmKind::kArena, capacity);
  if (!segment.ok()) {
    pw::MutexLock lock(&mu_);
    bytes_ -= capacity;
    return segment.status();
  }
  pw::MutexLock lock(&mu_);
  names_.push_back((*segment)->name());
  free_.push_back(*std::move(segment));
  return absl::OkStatus();
}

ShmWriterCache::ShmWriterCache(size_t max_mappings) : max_mappings_(max_mappings) {}

absl::Status ShmWriterCache::Write(const std::string& name, const void* data, size_t size) {
  std::shared_ptr<ShmSegment> segment;
  {
    pw::MutexLock lock(&mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      segment = *it->second;
    }
  }
  if (segment == nullptr) {
    absl::StatusOr<std::shared_ptr<ShmSegment>> opened = ShmSegment::Open(ShmKind::kArena, name);
    if (!opened.ok()) return opened.status();
    segment = *std::move(opened);
    pw::MutexLock lock(&mu_);
    if (!by_name_.contains(name)) {
      lru_.push_front(segment);
      by_name_[name] = lru_.begin();
      if (lru_.size() > max_mappings_) {
        by_name_.erase(lru_.back()->name());
        lru_.pop_back();  // Unmapped once no Write still uses it.
      }
    }
  }
  if (segment->capacity() < size)
    return absl::InvalidArgumentError(absl::StrCat("shared memory ", name, " holds ",
                                                   segment->capacity(), " bytes, need ", size));
  std::memcpy(segment->data(), data, size);
  return absl::OkStatus();
}

}  // namespace pw::dataplane
