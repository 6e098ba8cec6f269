// BulkClient: the reading end of the bulk stream (bulk_wire.h) to one peer worker's BulkServer:
// reads offered shards' bytes straight into their destination buffers.
//
// Up to kMaxThreads reads run at once, each on a thread of its own with a connection of its own;
// more wait in order. Connections stay open between reads for up to 50 s (the server closes one
// idle for 60 s; a read that finds its pooled connection closed before any reply is retried once
// on a new one). Connecting and the hello get 10 s; then a read making no progress for 60 s
// fails. With TLS (a client TlsContext), each connection starts with a TLS handshake that checks
// the server's certificate names `host` and presents this process's certificate. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "pw/dataplane/tls.h"

namespace pw::dataplane {

class BulkClient {
 public:
  static constexpr int kMaxThreads = 4;
  // Reads from the worker at `host` (a name or address, IPv6 without brackets: HostOf), saying
  // `token` (the cluster token; clients' transfers say their keys instead), over TLS when `tls`
  // is given.
  BulkClient(std::string host, std::string token, std::shared_ptr<const TlsContext> tls = nullptr);
  // Fails reads not started (Cancelled), aborts running ones, joins the threads (but the one
  // running this, when a read's `done` dropped the last reference).
  ~BulkClient();
  BulkClient(const BulkClient&) = delete;
  BulkClient& operator=(const BulkClient&) = delete;

  // Reads the `size` bytes offered under `ticket` by the server on `port` into `dst`, which must
  // stay valid until `done` runs. `done` runs once, on a reader thread (or in the destructor):
  // OK with all bytes in `dst`, or why not (the server's error, a size that differs, a broken
  // connection).
  void Read(int port, uint64_t ticket, void* dst, size_t size,
            absl::AnyInvocable<void(const absl::Status&)> done);

  // A client's transfer (bulk_server.h) on a connection of its own to `port`, whose hello says
  // `key`: reads the `size` bytes offered into `dst`, or writes `size` bytes from `src` (which
  // must stay valid until `done` runs). Same threads and `done` as Read.
  void ReadTransfer(int port, std::string key, void* dst, size_t size,
                    absl::AnyInvocable<void(const absl::Status&)> done);
  void WriteTransfer(int port, std::string key, const void* src, size_t size,
                     absl::AnyInvocable<void(const absl::Status&)> done);

  // Threads started so far (tests).
  int threads() const;

 private:
  struct Job;
  class State;  // Shared with the reader threads, so a read's `done` may drop the last client.
  const std::shared_ptr<State> state_;
};

}  // namespace pw::dataplane
