// Reusable shared-memory segments for shards moving between workers on one machine.
//
// A fresh segment per transfer costs page allocation and faults on both sides (slow in VMs).
// Instead the reader keeps a small pool of segments (ShmArena) and names a free one in its
// FetchShard request; the serving worker maps it once (ShmWriterCache), copies the shard in,
// and the reader copies it out and returns the segment to its pool (or keeps the segment as the
// shard's memory until the shard goes: PeerChannel::Fetch::Adopt). When no segment fits, the
// old path (a fresh segment per transfer) is used and the pool grows to the size seen.
//
// Thread-safe. Segments are ShmSegments of kind kArena (shm_segment.h: naming and cleanup); the
// reader unlinks its segments when the pool goes away.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "pw/base/mutex.h"
#include "pw/dataplane/shm_segment.h"

namespace pw::dataplane {

class ShmArena {
 public:
  explicit ShmArena(size_t max_segments = 8, size_t max_bytes = size_t{1} << 30);
  ~ShmArena();  // Unlinks every segment it made.
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  // Takes the largest free segment out of the pool (nullptr if none is free).
  std::shared_ptr<ShmSegment> Take();
  // Returns a taken segment to the pool.
  void Give(std::shared_ptr<ShmSegment> segment);
  // Adds a segment of at least `size` bytes for later transfers, if the limits allow (dropping
  // free ones too small for `size` to make room); at the limit with a free one that holds `size`,
  // nothing. Errors are not fatal: transfers fall back.
  absl::Status Grow(size_t size);
  // Forgets (and unlinks) a segment the writer could not use.
  void Discard(const std::shared_ptr<ShmSegment>& segment);
  // The peer is gone: unmaps and unlinks the free segments now, and those taken as they come
  // back; the pool grows no more. (A failed worker's stub may live on; its memory should not.)
  void Close();

 private:
  void Unlink(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const size_t max_segments_;
  const size_t max_bytes_;
  pw::Mutex mu_;
  std::vector<std::shared_ptr<ShmSegment>> free_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);  // Every live segment made here.
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// The writer's side: readers' segments mapped by name, the most recently used kept mapped.
class ShmWriterCache {
 public:
  explicit ShmWriterCache(size_t max_mappings = 32);
  // Copies `size` bytes of `data` to the start of segment `name`. NotFound if it no longer
  // exists; InvalidArgument if the name is not an arena's or the segment is too small.
  absl::Status Write(const std::string& name, const void* data, size_t size);

 private:
  const size_t max_mappings_;
  pw::Mutex mu_;
  std::list<std::shared_ptr<ShmSegment>> lru_ ABSL_GUARDED_BY(mu_);  // Most recent first.
  absl::flat_hash_map<std::string, std::list<std::shared_ptr<ShmSegment>>::iterator> by_name_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pw::dataplane
