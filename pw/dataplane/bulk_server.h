// BulkServer: the read side of the bulk stream (bulk_wire.h) in a worker. FetchShard offers a
// ready shard's bytes under a ticket; the reader connects, says the cluster token, and pulls the
// ticket's bytes, which are sent straight from the shard's memory.
//
// One thread accepts; each connection has its own thread (readers keep a few open, see
// BulkClient), at most kMaxConnections at once (one more is refused with ResourceExhausted), of
// which at most kMaxUnauthenticated have not yet said their hello: a new connection past that
// closes the oldest of those, so connections that never say hello (no token needed to open
// one) cannot keep peers out. A connection that has not said a correct hello within 10 s, or
// makes no progress for 60 s, is closed; a wrong ticket gets an error and the connection stays
// usable. With TLS (a server TlsContext), each connection starts with a mutual TLS handshake,
// within the hello's 10 s; a refused connection is then just closed.
//
// Clients' transfers (client I/O beside the controller, pw/rpc/README.md): a client of the
// cluster, which has no cluster token, reads or writes one shard on a connection of its own whose
// hello says the transfer's key (a secret the controller handed it) instead of the token; the
// connection then carries that one transfer and closes. A key is good for one use, until it
// expires. At most ClientLimits::max_client_transfers of them wait for their clients and at most
// max_client_connections are being served at once (a hello past that is refused with
// ResourceExhausted and the key kept), so clients' transfers cannot take the connections peers
// need. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "absl/time/time.h"
#include "pw/base/mutex.h"
#include "pw/dataplane/bulk_wire.h"
#include "pw/dataplane/tls.h"

namespace pw::dataplane {

// Limits on clients' transfers (BulkServer's class comment).
struct BulkClientLimits {
  int max_client_transfers = 1024;   // Waiting for their clients.
  int max_client_connections = 128;  // Being served (of BulkServer::kMaxConnections).
  // Bytes of the transfers waiting for their clients (each holds its shard's memory).
  int64_t max_client_bytes = int64_t{16} << 30;
};

class BulkServer {
 public:
  static constexpr int kMaxConnections = 256;
  static constexpr int kMaxUnauthenticated = 32;  // Of those, still saying hello.
  using ClientLimits = BulkClientLimits;
  // Listens on `host` (a name or address of this machine, IPv6 without brackets; "0.0.0.0",
  // "::": every interface)
  // at `port` (0: a free one). Connections must present `token`, after a TLS handshake when
  // `tls` is given (a server context).
  static absl::StatusOr<std::unique_ptr<BulkServer>> Start(
      const std::string& host, int port, std::string token,
      std::shared_ptr<const TlsContext> tls = nullptr, ClientLimits limits = {});
  // Stop, then frees the server.
  ~BulkServer();
  // Closes every connection and joins its thread, then fails the offers and transfers still
  // open (Cancelled); offers made after it fail at once. Idempotent; not concurrently with the
  // destructor.
  void Stop();
  BulkServer(const BulkServer&) = delete;
  BulkServer& operator=(const BulkServer&) = delete;

  int port() const { return port_; }

  // Offers `size` bytes at `data`, kept alive by `keep` until sent, under a new ticket (one read).
  // `done` runs once, on a connection's thread, in Withdraw or in Stop: OK once the bytes were
  // sent, an error if sending failed, Cancelled if the offer was withdrawn or the server stopped
  // first.
  uint64_t Offer(std::shared_ptr<const void> keep, const char* data, size_t size,
                 absl::AnyInvocable<void(const absl::Status&)> done);
  // Clients' transfers under `key` (at least kMinKeyBytes): a read of `size` bytes at `data`, or
  // a write of `size` bytes into `data`; `keep` keeps `data` alive until `done` has run, which
  // it does once: when the transfer is over (OK, or why it failed), DeadlineExceeded if no
  // client began it by `expires`, Cancelled when the server stops or the transfer is withdrawn.
  // A refused transfer (a key too short or already in use, too many waiting or too many bytes,
  // the server stopped) returns why, and `done` does not run. `owner` groups transfers for
  // WithdrawClientTransfers (the worker: the buffer's id).
  static constexpr size_t kMinKeyBytes = 16;
  absl::Status OfferToClient(std::string key, int64_t owner, std::shared_ptr<const void> keep,
                             const char* data, size_t size, absl::Time expires,
                             absl::AnyInvocable<void(const absl::Status&)> done);
  absl::Status AcceptFromClient(std::string key, int64_t owner, std::shared_ptr<void> keep,
                                char* data, size_t size, absl::Time expires,
                                absl::AnyInvocable<void(const absl::Status&)> done);
  // Fails (Cancelled, naming `why`) the transfers of `owners` that no client has begun, and
  // frees what they hold; ones being served go on.
  void WithdrawClientTransfers(absl::Span<const int64_t> owners, absl::string_view why);
  // Clients' transfers not yet begun, and their bytes.
  size_t open_client_transfers() const;
  int64_t open_client_bytes() const;
  // Withdraws an offer not yet taken (no effect on one being sent or done).
  void Withdraw(uint64_t ticket);
  // Offers open now.
  size_t open_offers() const;
  // Bytes of offers sent in full so far.
  int64_t sent_bytes() const { return sent_bytes_.load(std::memory_order_relaxed); }
  // Bytes of clients' uploads received in full so far.
  int64_t received_bytes() const { return received_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Offered {
    std::shared_ptr<const void> keep;
    const char* data;
    size_t size;
    absl::AnyInvocable<void(const absl::Status&)> done;
  };
  struct ClientTransfer {
    int64_t owner = 0;
    std::shared_ptr<const void> keep;
    const char* data = nullptr;  // A read's source.
    char* dst = nullptr;         // A write's destination.
    size_t size = 0;
    absl::Time expires;
    absl::AnyInvocable<void(const absl::Status&)> done;
  };
  struct Connection {
    int fd;
    std::thread thread;
    std::atomic<bool> finished{false};
    bool greeted = false;  // Said its hello (or was closed for not saying it). Under mu_.
  };
  BulkServer(int listen_fd, int port, std::string token, std::shared_ptr<const TlsContext> tls,
             ClientLimits limits);
  void AcceptLoop();
  void Serve(Connection* c);
  // Serves the peer reads of a connection that said the cluster token.
  void ServePeer(bulk::Conn& fd);
  // Serves the client transfer a connection's hello named: how it went.
  absl::Status ServeClient(bulk::Conn& fd, const ClientTransfer& t);
  absl::Status AddClientTransfer(std::string key, ClientTransfer t);
  // Removes a waiting transfer from the table (and its bytes from the count).
  ClientTransfer TakeClientTransfer(
      absl::flat_hash_map<std::string, ClientTransfer>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails transfers whose time is up, until the server stops.
  void ExpireLoop();
  // Reaps finished connections' threads (joins them).
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);

  const int listen_fd_;
  const int port_;
  const std::string token_;
  const std::shared_ptr<const TlsContext> tls_;
  const ClientLimits limits_;
  std::thread acceptor_;
  std::thread expirer_;
  std::atomic<int64_t> sent_bytes_{0};
  std::atomic<int64_t> received_bytes_{0};
  mutable pw::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ = false;  // Stop has run (only its caller's thread reads it).
  int unauthenticated_ ABSL_GUARDED_BY(mu_) = 0;
  int client_connections_ ABSL_GUARDED_BY(mu_) = 0;  // Serving a client's transfer.
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Offered> offers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ClientTransfer> client_transfers_ ABSL_GUARDED_BY(mu_);
  int64_t client_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Of client_transfers_.
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw::dataplane
