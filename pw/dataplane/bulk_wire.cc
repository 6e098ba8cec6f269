#include "pw/dataplane/bulk_wire.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "pw/base/status_macros.h"

namespace pw::dataplane::bulk {

static_assert(std::endian::native == std::endian::little, "the bulk wire is little-endian");

namespace {
absl::Status SocketError(absl::string_view what, int err) {
  if (err == EAGAIN || err == EWOULDBLOCK)
    return absl::DeadlineExceededError(absl::StrCat(what, ": the peer made no progress in time"));
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}
// errno for an SSL_read/SSL_write that returned `r` <= 0; false when the peer closed cleanly.
bool SslErrno(ssl_st* ssl, int r) {
  const int e = SSL_get_error(ssl, r);
  ERR_clear_error();
  if (e == SSL_ERROR_ZERO_RETURN) return false;
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    errno = EAGAIN;
  } else if (e == SSL_ERROR_SYSCALL) {
    if (errno == 0) return false;  // EOF without close_notify.
  } else {
    errno = EPROTO;
  }
  return true;
}
}  // namespace

Conn::~Conn() {
  if (ssl_ != nullptr) SSL_free(ssl_);
}

ssize_t Conn::Send(const void* data, size_t n) {
  if (ssl_ == nullptr) return send(fd_, data, n, MSG_NOSIGNAL);
  errno = 0;
  const int w = SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (w > 0) return w;
  if (!SslErrno(ssl_, w)) errno = EPIPE;
  return -1;
}

ssize_t Conn::Recv(void* data, size_t n) {
  if (ssl_ == nullptr) return recv(fd_, data, n, 0);
  errno = 0;
  const int r = SSL_read(ssl_, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (r > 0) return r;
  return SslErrno(ssl_, r) ? -1 : 0;
}

absl::Status SendAll(Conn& c, const void* data, size_t n, absl::string_view what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = c.Send(p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return SocketError(what, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(Conn& c, void* data, size_t n, absl::string_view what, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration())
        return absl::DeadlineExceededError(absl::StrCat(what, ": not all of it came in time"));
      const timeval tv = absl::ToTimeval(std::max(left, absl::Milliseconds(1)));
      setsockopt(c.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    const ssize_t r = c.Recv(p, n);
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

absl::Status SendU64(Conn& c, uint64_t v, absl::string_view what) {
  return SendAll(c, &v, sizeof(v), what);
}

absl::Status RecvU64(Conn& c, uint64_t* v, absl::string_view what) {
  return RecvAll(c, v, sizeof(*v), what);
}

absl::Status SendStatus(Conn& c, const absl::Status& s) {
  const absl::string_view m = s.message().substr(0, kMaxMessageBytes);
  char header[8];
  const uint32_t code = static_cast<uint32_t>(s.code());
  const uint32_t len = static_cast<uint32_t>(m.size());
  std::memcpy(header, &code, 4);
  std::memcpy(header + 4, &len, 4);
  PW_RETURN_IF_ERROR(SendAll(c, header, sizeof(header), "sending a status"));
  return SendAll(c, m.data(), m.size(), "sending a status");
}

absl::Status RecvStatus(Conn& c, absl::Status* got) {
  char header[8];
  PW_RETURN_IF_ERROR(RecvAll(c, header, sizeof(header), "reading a status"));
  uint32_t code, len;
  std::memcpy(&code, header, 4);
  std::memcpy(&len, header + 4, 4);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated) || len > kMaxMessageBytes)
    return absl::DataLossError(
        absl::StrCat("bulk stream: a status with code ", code, " and ", len, " message bytes"));
  std::string message(len, '\0');
  PW_RETURN_IF_ERROR(RecvAll(c, message.data(), len, "reading a status"));
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

}  // namespace pw::dataplane::bulk
