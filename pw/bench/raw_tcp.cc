#include "pw/bench/raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pw {
namespace {

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat("raw tcp: ", what, ": ", std::strerror(errno)));
}

bool WriteAll(int fd, const void* p, size_t n) {
  for (size_t done = 0; done < n;) {
    ssize_t w = write(fd, static_cast<const char*>(p) + done, n - done);
    if (w <= 0) return false;
    done += w;
  }
  return true;
}
bool ReadAll(int fd, void* p, size_t n) {
  for (size_t done = 0; done < n;) {
    ssize_t r = read(fd, static_cast<char*>(p) + done, n - done);
    if (r <= 0) return false;
    done += r;
  }
  return true;
}

}  // namespace

absl::Status RawTcp::Open() {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return Errno("listen");
  sink_ = std::thread([this, l] {
    int fd = accept(l, nullptr, nullptr);
    close(l);
    // Where the bytes land: one buffer of the message's size (the largest so far), reused, as a
    // receiver writes into its destination rather than over a small scratch buffer in cache.
    std::vector<char> buf;
    int64_t want = 0;
    while (fd >= 0 && ReadAll(fd, &want, sizeof(want)) && want > 0) {
      if (static_cast<int64_t>(buf.size()) < want) buf.resize(want);
      if (!ReadAll(fd, buf.data(), want)) break;
      char ack = 1;
      if (write(fd, &ack, 1) != 1) break;
    }
    if (fd >= 0) close(fd);
  });
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return Errno("connect");
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return absl::OkStatus();
}

RawTcp::~RawTcp() {
  if (fd_ >= 0) {
    int64_t zero = 0;
    (void)!write(fd_, &zero, sizeof(zero));
    close(fd_);
  }
  if (sink_.joinable()) sink_.join();
}

// Sends `data` and waits for the far end to have read all of it.
absl::Status RawTcp::Send(const std::vector<char>& data) {
  int64_t n = static_cast<int64_t>(data.size());
  if (!WriteAll(fd_, &n, sizeof(n)) || !WriteAll(fd_, data.data(), data.size()))
    return Errno("write");
  char ack;
  if (read(fd_, &ack, 1) != 1) return Errno("ack");
  return absl::OkStatus();
}


}  // namespace pw
