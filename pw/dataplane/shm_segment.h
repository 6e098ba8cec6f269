// POSIX shared-memory segments: the one implementation behind every use of shared memory between
// processes on one machine — reusable transfer pools (shm_arena.h), one-transfer segments
// (below) and collectives' mailboxes (shm_mailbox.h).
//
// Naming: "/pw-<kind>-<pid>-<salt>-<n>" (kind "arena", "xfer" or "mbox"; pid of the creator; a
// random salt per process; a counter), made only by Create and never reused; Open takes only
// names of the kind it is asked for. Cleanup: the creator unlinks what it made (arenas and
// mailboxes when they go), except a one-transfer segment, which its reader unlinks as it opens
// it; RemoveStaleSegments unlinks the segments of processes that are gone (killed with SIGKILL).
//
// Thread-safe: a segment's name and mapping never change; what its bytes mean is its users'.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pw::dataplane {

enum class ShmKind { kArena, kTransfer, kMailbox };

class ShmSegment {
 public:
  // Creates and maps (read-write, pages populated) a new segment of `size` bytes.
  static absl::StatusOr<std::shared_ptr<ShmSegment>> Create(ShmKind kind, size_t size);
  // Maps an existing segment read-write, all of it. InvalidArgument if `name` is not a pathways
  // segment of `kind`; NotFound if it no longer exists.
  static absl::StatusOr<std::shared_ptr<ShmSegment>> Open(ShmKind kind, const std::string& name);
  ~ShmSegment();  // Unmaps; does not unlink.
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }
  char* data() const { return data_; }  // Null when the capacity is 0.
  size_t capacity() const { return capacity_; }
  // Removes the name (the mapping stays until the segment goes).
  void Unlink() const;

 private:
  ShmSegment(std::string name, char* data, size_t capacity)
      : name_(std::move(name)), data_(data), capacity_(capacity) {}
  const std::string name_;
  char* const data_;
  const size_t capacity_;
};

// One-transfer segments: the writer makes a segment holding `size` bytes of `data` and names it to
// the reader, which copies exactly `size` bytes into `dst` and unlinks it (also on error).
absl::StatusOr<std::string> WriteSharedMemory(const void* data, size_t size);
absl::Status ReadSharedMemory(const std::string& name, void* dst, size_t size);
// Removes a one-transfer segment no reader will take.
void UnlinkSharedMemory(const std::string& name);

// Unlinks pathways segments whose creating process is gone and, with `this_process`, this pid's
// own: those of the image this process replaced with exec (call it only before this process has
// made any). Returns how many.
int RemoveStaleSegments(bool this_process = false);

}  // namespace pw::dataplane
