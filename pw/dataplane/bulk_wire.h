// The bulk stream's wire format: large shards' bytes between machines on TCP (TLS over it when the
// cluster uses TLS: tls.h), beside gRPC.
//
// Why not gRPC: a shard's bytes in gRPC messages are copied into protobuf, into gRPC's slices and
// out again on both ends (4 copies beside the kernel's); a plain socket reads them straight into
// the destination buffer. gRPC still carries the request, the wait for the shard and the outcome
// (FetchShard): a reader connects here only to pull a shard that is ready, under a ticket that
// FetchShard handed it, so a bulk connection is never held by a shard that is not yet computed.
//
// A connection (client → server, all integers little-endian):
//   hello:   "PWB1", u32 version, u32 token length (≤ kMaxTokenBytes), the cluster token
//   reply:   status
//   then any number of reads:  u64 ticket  →  status, and if OK: u64 size, `size` bytes
// status:    u32 absl::StatusCode, u32 message length (≤ kMaxMessageBytes), the message
// A refused hello is answered with its status, then the server closes the connection.
// A client's transfer (bulk_server.h) says its key instead of the token; after the OK:
//   a read:   u64 size, `size` bytes; then the server closes
//   a write:  u64 size  →  status (the size is the shard's); `size` bytes  →  status; closed
// The server tells the two apart by the key.
//
// Thread-compatible functions on blocking sockets.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct ssl_st;  // OpenSSL's SSL.

namespace pw::dataplane::bulk {

// One connection's byte stream: the socket itself, or TLS over it (made by TlsContext). Does not
// own the socket. Thread-compatible.
class Conn {
 public:
  explicit Conn(int fd, ssl_st* ssl = nullptr) : fd_(fd), ssl_(ssl) {}
  ~Conn();  // Frees the TLS session (not the socket).
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }
  // As send(2) (never raising SIGPIPE) and recv(2): bytes moved, 0 when the peer closed (Recv),
  // or -1 with errno set (EAGAIN: the socket's timeout; EPROTO: a TLS error).
  ssize_t Send(const void* data, size_t n);
  ssize_t Recv(void* data, size_t n);

 private:
  const int fd_;
  ssl_st* const ssl_;
};

inline constexpr char kMagic[4] = {'P', 'W', 'B', '1'};
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kMaxTokenBytes = 4096;
inline constexpr uint32_t kMaxMessageBytes = 4096;

// All `n` bytes, or an error naming `what` (a peer that closed early: Unavailable; a socket
// timeout, or `deadline` passed: DeadlineExceeded). A finite deadline resets the socket's
// receive timeout.
absl::Status SendAll(Conn& c, const void* data, size_t n, absl::string_view what);
absl::Status RecvAll(Conn& c, void* data, size_t n, absl::string_view what,
                     absl::Time deadline = absl::InfiniteFuture());
absl::Status SendU64(Conn& c, uint64_t v, absl::string_view what);
absl::Status RecvU64(Conn& c, uint64_t* v, absl::string_view what);

// A status on the wire. RecvStatus returns the transport's error, or OK with the status read in
// `*got` (a code that is not canonical, or a message too long, is a DataLoss error).
absl::Status SendStatus(Conn& c, const absl::Status& s);
absl::Status RecvStatus(Conn& c, absl::Status* got);

// Sets the socket's send and receive timeouts (0: none), TCP_NODELAY and SO_KEEPALIVE.
void Configure(int fd, int timeout_seconds);

}  // namespace pw::dataplane::bulk
