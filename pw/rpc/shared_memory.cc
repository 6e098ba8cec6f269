#include "pw/rpc/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pw::rpc {
namespace {
absl::Status Errno(absl::string_view what, const std::string& name) {
  return absl::InternalError(absl::StrCat("shared memory ", name, ": ", what, ": ",
                                          std::strerror(errno)));
}
}  // namespace

absl::StatusOr<std::string> WriteSharedMemory(const void* data, size_t size) {
  static std::atomic<uint64_t> counter{0};
  static const uint32_t salt = std::random_device()();
  const std::string name = absl::StrFormat("/pw-%d-%08x-%d", getpid(), salt, counter++);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Errno("shm_open", name);
  absl::Status error;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    error = Errno("ftruncate", name);
  } else if (size > 0) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      error = Errno("mmap", name);
    } else {
      std::memcpy(p, data, size);
      munmap(p, size);
    }
  }
  close(fd);
  if (!error.ok()) {
    shm_unlink(name.c_str());
    return error;
  }
  return name;
}

void UnlinkSharedMemory(const std::string& name) { shm_unlink(name.c_str()); }

absl::Status ReadSharedMemory(const std::string& name, void* dst, size_t size) {
  if (!absl::StartsWith(name, "/pw-") || name.find('/', 1) != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("not a pathways shared-memory segment: ", name));
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return Errno("shm_open", name);
  shm_unlink(name.c_str());  // The mapping keeps it alive until we are done.
  absl::Status error;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    error = Errno("fstat", name);
  } else if (static_cast<size_t>(st.st_size) != size) {
    error = absl::DataLossError(absl::StrCat("shared memory ", name, " holds ", st.st_size,
                                             " bytes, expected ", size));
  } else if (size > 0) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      error = Errno("mmap", name);
    } else {
      std::memcpy(dst, p, size);
      munmap(p, size);
    }
  }
  close(fd);
  return error;
}

}  // namespace pw::rpc
