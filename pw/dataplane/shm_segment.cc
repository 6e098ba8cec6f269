#include "pw/dataplane/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace pw::dataplane {
namespace {

absl::string_view KindName(ShmKind kind) {
  switch (kind) {
    case ShmKind::kArena:
      return "arena";
    case ShmKind::kTransfer:
      return "xfer";
    case ShmKind::kMailbox:
      return "mbox";
  }
  return "?";
}

std::string NewName(ShmKind kind) {
  static std::atomic<uint64_t> counter{0};
  static const uint32_t salt = std::random_device()();
  return absl::StrFormat("/pw-%s-%d-%08x-%d", KindName(kind), getpid(), salt, counter++);
}

absl::Status Errno(absl::string_view what, const std::string& name) {
  const int e = errno;
  const std::string message =
      absl::StrCat("shared memory ", name, ": ", what, ": ", std::strerror(e));
  return e == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
}

// Maps `size` bytes of `fd` read-write (nothing for 0 bytes).
absl::StatusOr<char*> Map(int fd, size_t size, bool populate, const std::string& name) {
  if (size == 0) return nullptr;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0),
                 fd, 0);
  if (p == MAP_FAILED) return Errno("mmap", name);
  return static_cast<char*>(p);
}

}  // namespace

absl::StatusOr<std::shared_ptr<ShmSegment>> ShmSegment::Create(ShmKind kind, size_t size) {
  std::string name = NewName(kind);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Errno("shm_open", name);
  absl::StatusOr<char*> data = ftruncate(fd, static_cast<off_t>(size)) == 0
                                   ? Map(fd, size, /*populate=*/true, name)
                                   : Errno("ftruncate", name);
  close(fd);
  if (!data.ok()) {
    shm_unlink(name.c_str());
    return data.status();
  }
  return std::shared_ptr<ShmSegment>(new ShmSegment(std::move(name), *data, size));
}

absl::StatusOr<std::shared_ptr<ShmSegment>> ShmSegment::Open(ShmKind kind,
                                                             const std::string& name) {
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, absl::StrCat("/pw-", KindName(kind), "-")) ||
      rest.find('/') != absl::string_view::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("not a pathways shared-memory segment of kind ", KindName(kind), ": ", name));
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Errno("shm_open", name);
  struct stat st;
  // A one-transfer segment is read whole at once: its pages are populated with the mapping.
  const bool populate = kind == ShmKind::kTransfer;
  absl::StatusOr<char*> data = fstat(fd, &st) == 0
                                   ? Map(fd, static_cast<size_t>(st.st_size), populate, name)
                                   : Errno("fstat", name);
  close(fd);
  if (!data.ok()) return data.status();
  return std::shared_ptr<ShmSegment>(new ShmSegment(name, *data, static_cast<size_t>(st.st_size)));
}

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) munmap(data_, capacity_);
}

void ShmSegment::Unlink() const { shm_unlink(name_.c_str()); }

absl::StatusOr<std::string> WriteSharedMemory(const void* data, size_t size) {
  absl::StatusOr<std::shared_ptr<ShmSegment>> s = ShmSegment::Create(ShmKind::kTransfer, size);
  if (!s.ok()) return s.status();
  if (size > 0) std::memcpy((*s)->data(), data, size);
  return (*s)->name();  // Unmapped here; the reader unlinks it.
}

absl::Status ReadSharedMemory(const std::string& name, void* dst, size_t size) {
  absl::StatusOr<std::shared_ptr<ShmSegment>> s = ShmSegment::Open(ShmKind::kTransfer, name);
  if (!s.ok()) {
    // A segment that exists but cannot be mapped is not left behind (the writer let it go).
    if (!absl::IsInvalidArgument(s.status()) && !absl::IsNotFound(s.status()))
      shm_unlink(name.c_str());
    return s.status();
  }
  (*s)->Unlink();  // The mapping keeps it alive until we are done.
  if ((*s)->capacity() != size)
    return absl::DataLossError(absl::StrCat("shared memory ", name, " holds ", (*s)->capacity(),
                                            " bytes, expected ", size));
  if (size > 0) std::memcpy(dst, (*s)->data(), size);
  return absl::OkStatus();
}

void UnlinkSharedMemory(const std::string& name) {
  if (absl::StartsWith(name, "/pw-xfer-")) shm_unlink(name.c_str());
}

int RemoveStaleSegments(bool this_process) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* e = readdir(dir)) {
    absl::string_view n = e->d_name;
    if (!absl::ConsumePrefix(&n, "pw-")) continue;
    bool ours = false;
    for (ShmKind kind : {ShmKind::kArena, ShmKind::kTransfer, ShmKind::kMailbox})
      ours = ours || absl::ConsumePrefix(&n, absl::StrCat(KindName(kind), "-"));
    int pid = 0;
    if (!ours || !absl::SimpleAtoi(n.substr(0, n.find('-')), &pid) || pid <= 0) continue;
    const bool gone = (this_process && pid == getpid()) || (kill(pid, 0) != 0 && errno == ESRCH);
    if (gone && shm_unlink(absl::StrCat("/", e->d_name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace pw::dataplane
