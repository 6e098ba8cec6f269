#include "pw/rpc/bulk_wire.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "pw/base/status_macros.h"

namespace pw::rpc::bulk {

static_assert(std::endian::native == std::endian::little, "the bulk wire is little-endian");

namespace {
absl::Status SocketError(absl::string_view what, int err) {
  if (err == EAGAIN || err == EWOULDBLOCK)
    return absl::DeadlineExceededError(absl::StrCat(what, ": the peer made no progress in time"));
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}
}  // namespace

absl::Status SendAll(int fd, const void* data, size_t n, absl::string_view what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return SocketError(what, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t n, absl::string_view what, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration())
        return absl::DeadlineExceededError(absl::StrCat(what, ": not all of it came in time"));
      const timeval tv = absl::ToTimeval(std::max(left, absl::Milliseconds(1)));
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    const ssize_t r = recv(fd, p, n, 0);
    if (r == 0)
      return absl::UnavailableError(absl::StrCat(what, ": the peer closed the connection"));
    if (r < 0) {
      if (errno == EINTR) continue;
      return SocketError(what, errno);
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status SendU64(int fd, uint64_t v, absl::string_view what) {
  return SendAll(fd, &v, sizeof(v), what);
}

absl::Status RecvU64(int fd, uint64_t* v, absl::string_view what) {
  return RecvAll(fd, v, sizeof(*v), what);
}

absl::Status SendStatus(int fd, const absl::Status& s) {
  const absl::string_view m = s.message().substr(0, kMaxMessageBytes);
  char header[8];
  const uint32_t code = static_cast<uint32_t>(s.code());
  const uint32_t len = static_cast<uint32_t>(m.size());
  std::memcpy(header, &code, 4);
  std::memcpy(header + 4, &len, 4);
  PW_RETURN_IF_ERROR(SendAll(fd, header, sizeof(header), "sending a status"));
  return SendAll(fd, m.data(), m.size(), "sending a status");
}

absl::Status RecvStatus(int fd, absl::Status* got) {
  char header[8];
  PW_RETURN_IF_ERROR(RecvAll(fd, header, sizeof(header), "reading a status"));
  uint32_t code, len;
  std::memcpy(&code, header, 4);
  std::memcpy(&len, header + 4, 4);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated) || len > kMaxMessageBytes)
    return absl::DataLossError(
        absl::StrCat("bulk stream: a status with code ", code, " and ", len, " message bytes"));
  std::string message(len, '\0');
  PW_RETURN_IF_ERROR(RecvAll(fd, message.data(), len, "reading a status"));
  if (code == 0) {
    *got = absl::OkStatus();
  } else {
    *got = absl::Status(static_cast<absl::StatusCode>(code), message);
  }
  return absl::OkStatus();
}

void Configure(int fd, int timeout_seconds) {
  timeval tv{.tv_sec = timeout_seconds, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

}  // namespace pw::rpc::bulk
