#include "pw/rpc/shm_arena.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace pw::rpc {
namespace {

constexpr absl::string_view kPrefix = "/pw-arena-";

absl::Status Errno(absl::string_view what, const std::string& name) {
  return absl::InternalError(
      absl::StrCat("shared memory ", name, ": ", what, ": ", std::strerror(errno)));
}

}  // namespace

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) munmap(data_, capacity_);
}

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
  static std::atomic<uint64_t> counter{0};
  static const uint32_t salt = std::random_device()();
  const std::string name = absl::StrFormat("%s%d-%08x-%d", kPrefix, getpid(), salt, counter++);
  auto undo = [&](absl::Status s) {
    pw::MutexLock lock(&mu_);
    bytes_ -= capacity;
    return s;
  };
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return undo(Errno("shm_open", name));
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(capacity)) == 0)
    p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const absl::Status error = p == MAP_FAILED ? Errno("ftruncate/mmap", name) : absl::OkStatus();
  close(fd);
  if (!error.ok()) {
    shm_unlink(name.c_str());
    return undo(error);
  }
  std::shared_ptr<ShmSegment> segment(new ShmSegment(name, static_cast<char*>(p), capacity));
  pw::MutexLock lock(&mu_);
  names_.push_back(name);
  free_.push_back(std::move(segment));
  return absl::OkStatus();
}

ShmWriterCache::ShmWriterCache(size_t max_mappings) : max_mappings_(max_mappings) {}

absl::Status ShmWriterCache::Write(const std::string& name, const void* data, size_t size) {
  if (!absl::StartsWith(name, kPrefix) || name.find('/', 1) != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("not a pathways arena segment: ", name));
  std::shared_ptr<ShmSegment> segment;
  {
    pw::MutexLock lock(&mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      segment = *it->second;
    }
  }
  if (segment == nullptr) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      return errno == ENOENT ? absl::NotFoundError(absl::StrCat("shared memory ", name, " is gone"))
                             : Errno("shm_open", name);
    }
    struct stat st;
    void* p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > 0)
      p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return Errno("fstat/mmap", name);
    segment.reset(new ShmSegment(name, static_cast<char*>(p), static_cast<size_t>(st.st_size)));
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

int RemoveStaleSegments(bool this_process) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* e = readdir(dir)) {
    // Arena segments, mailboxes and one-transfer segments: "pw-[arena-|mbox-]<pid>-...".
    absl::string_view n = e->d_name;
    if (!absl::ConsumePrefix(&n, "pw-")) continue;
    if (!absl::ConsumePrefix(&n, "arena-")) absl::ConsumePrefix(&n, "mbox-");
    int pid = 0;
    if (!absl::SimpleAtoi(n.substr(0, n.find('-')), &pid) || pid <= 0) continue;
    const bool gone = (this_process && pid == getpid()) || (kill(pid, 0) != 0 && errno == ESRCH);
    if (gone && shm_unlink(absl::StrCat("/", e->d_name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace pw::rpc
