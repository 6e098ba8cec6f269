#include "pw/dataplane/bulk_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "pw/base/status_macros.h"
#include "pw/base/secret.h"
#include "pw/dataplane/bulk_wire.h"

namespace pw::dataplane {
namespace {

constexpr int kHelloSeconds = 10;     // A whole hello must arrive in this time.
constexpr int kProgressSeconds = 60;  // Then, no progress for this long closes the connection.

absl::Status Refuse(bulk::Conn& fd, const absl::Status& why) {
  (void)bulk::SendStatus(fd, why);
  return why;
}

// Reads a connection's hello, which must arrive by `deadline`: the token (or transfer key) it
// says. A malformed hello is answered (refused) here; the caller answers the rest.
absl::StatusOr<std::string> ReadHello(bulk::Conn& fd, absl::Time deadline) {
  char head[12];
  PW_RETURN_IF_ERROR(bulk::RecvAll(fd, head, sizeof(head), "bulk stream hello", deadline));
  if (std::memcmp(head, bulk::kMagic, 4) != 0)
    return Refuse(fd, absl::InvalidArgumentError(
                          "bulk stream: not a pathways bulk connection (bad magic)"));
  uint32_t version, len;
  std::memcpy(&version, head + 4, 4);
  std::memcpy(&len, head + 8, 4);
  if (version != bulk::kVersion)
    return Refuse(fd, absl::FailedPreconditionError(
                          absl::StrCat("bulk stream: protocol version ", version,
                                       " is not this worker's (", bulk::kVersion, ")")));
  if (len > bulk::kMaxTokenBytes)
    return Refuse(fd, absl::InvalidArgumentError(absl::StrCat(
                          "bulk stream: a token of ", len, " bytes (at most ",
                          bulk::kMaxTokenBytes, ")")));
  std::string got(len, '\0');
  PW_RETURN_IF_ERROR(bulk::RecvAll(fd, got.data(), len, "bulk stream hello", deadline));
  return got;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BulkServer>> BulkServer::Start(
    const std::string& host, int port, std::string token,
    std::shared_ptr<const TlsContext> tls, ClientLimits limits) {
  if (token.empty()) return absl::InvalidArgumentError("bulk server: needs the cluster token");
  if (port < 0 || port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("bulk server: port ", port, " is not a port"));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found); e != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("bulk server: cannot resolve '", host, "': ", gai_strerror(e)));
  absl::Status why = absl::UnavailableError(absl::StrCat("bulk server: no address for ", host));
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      why = absl::UnavailableError(
          absl::StrCat("bulk server: cannot listen on ", host, " port ", port, ": ",
                       std::strerror(errno)));
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return why;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::unique_ptr<BulkServer> s(
      new BulkServer(fd, bound_port, std::move(token), std::move(tls), limits));
  s->acceptor_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  s->expirer_ = std::thread([p = s.get()] { p->ExpireLoop(); });
  return s;
}

BulkServer::BulkServer(int listen_fd, int port, std::string token,
                       std::shared_ptr<const TlsContext> tls, ClientLimits limits)
    : listen_fd_(listen_fd),
      port_(port),
      token_(std::move(token)),
      tls_(std::move(tls)),
      limits_(limits),
      next_ticket_(absl::Uniform<uint64_t>(absl::BitGen()) | 1) {}

BulkServer::~BulkServer() { Stop(); }

void BulkServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  std::list<Connection> connections;
  {
    pw::MutexLock lock(&mu_);
    stopping_ = true;
    shutdown(listen_fd_, SHUT_RDWR);  // Wakes accept().
    for (Connection& c : connections_) shutdown(c.fd, SHUT_RDWR);
  }
  acceptor_.join();
  expirer_.join();
  close(listen_fd_);
  {
    pw::MutexLock lock(&mu_);
    connections.splice(connections.end(), connections_);
  }
  for (Connection& c : connections) {
    c.thread.join();
    close(c.fd);
  }
  absl::flat_hash_map<uint64_t, Offered> offers;
  absl::flat_hash_map<std::string, ClientTransfer> transfers;
  {
    pw::MutexLock lock(&mu_);
    offers.swap(offers_);
    transfers.swap(client_transfers_);
    client_bytes_ = 0;
  }
  const absl::Status stopped = absl::CancelledError("the worker's bulk server stopped");
  for (auto& [ticket, o] : offers) o.done(stopped);
  for (auto& [key, t] : transfers) t.done(stopped);
}

absl::Status BulkServer::OfferToClient(std::string key, int64_t owner,
                                       std::shared_ptr<const void> keep, const char* data,
                                       size_t size, absl::Time expires,
                                       absl::AnyInvocable<void(const absl::Status&)> done) {
  ClientTransfer t;
  t.owner = owner;
  t.keep = std::move(keep);
  t.data = data;
  t.size = size;
  t.expires = expires;
  t.done = std::move(done);
  return AddClientTransfer(std::move(key), std::move(t));
}

absl::Status BulkServer::AcceptFromClient(std::string key, int64_t owner,
                                          std::shared_ptr<void> keep, char* data, size_t size,
                                          absl::Time expires,
                                          absl::AnyInvocable<void(const absl::Status&)> done) {
  ClientTransfer t;
  t.owner = owner;
  t.keep = std::move(keep);
  t.dst = data;
  t.size = size;
  t.expires = expires;
  t.done = std::move(done);
  return AddClientTransfer(std::move(key), std::move(t));
}

absl::Status BulkServer::AddClientTransfer(std::string key, ClientTransfer t) {
  pw::MutexLock lock(&mu_);
  if (stopping_) return absl::CancelledError("the worker's bulk server stopped");
  if (key.size() < kMinKeyBytes || key.size() > bulk::kMaxTokenBytes)
    return absl::InvalidArgumentError(absl::StrCat("bulk stream: a transfer key of ", key.size(),
                                                   " bytes (", kMinKeyBytes, " to ",
                                                   bulk::kMaxTokenBytes, ")"));
  if (SecretEquals(key, token_) || client_transfers_.contains(key))
    return absl::AlreadyExistsError("bulk stream: that transfer key is already in use");
  if (client_transfers_.size() >= static_cast<size_t>(limits_.max_client_transfers))
    return absl::ResourceExhaustedError(absl::StrCat(
        "bulk stream: this worker already holds ", limits_.max_client_transfers,
        " clients' transfers that no client has begun (each waits until its client comes or "
        "it expires)"));
  const int64_t bytes = static_cast<int64_t>(t.size);
  if (bytes > limits_.max_client_bytes - client_bytes_)
    return absl::ResourceExhaustedError(absl::StrCat(
        "bulk stream: this worker already holds ", client_bytes_, " bytes of clients' transfers "
        "that no client has begun; ", bytes, " more would pass its limit of ",
        limits_.max_client_bytes));
  client_bytes_ += bytes;
  client_transfers_.emplace(std::move(key), std::move(t));
  return absl::OkStatus();
}

BulkServer::ClientTransfer BulkServer::TakeClientTransfer(
    absl::flat_hash_map<std::string, ClientTransfer>::iterator it) {
  ClientTransfer t = std::move(it->second);
  client_transfers_.erase(it);
  client_bytes_ -= static_cast<int64_t>(t.size);
  return t;
}

void BulkServer::WithdrawClientTransfers(absl::Span<const int64_t> owners, absl::string_view why) {
  std::vector<ClientTransfer> withdrawn;
  {
    pw::MutexLock lock(&mu_);
    if (client_transfers_.empty()) return;
    for (auto it = client_transfers_.begin(); it != client_transfers_.end();) {
      auto next = std::next(it);
      if (absl::c_linear_search(owners, it->second.owner))
        withdrawn.push_back(TakeClientTransfer(it));
      it = next;
    }
  }
  const absl::Status cancelled = absl::CancelledError(
      absl::StrCat("bulk stream: the transfer was withdrawn before its client began it: ", why));
  for (ClientTransfer& t : withdrawn) t.done(cancelled);
}

size_t BulkServer::open_client_transfers() const {
  pw::MutexLock lock(&mu_);
  return client_transfers_.size();
}

int64_t BulkServer::open_client_bytes() const {
  pw::MutexLock lock(&mu_);
  return client_bytes_;
}

void BulkServer::ExpireLoop() {
  while (true) {
    std::vector<ClientTransfer> expired;
    {
      pw::MutexLock lock(&mu_);
      absl::Time next = absl::Now() + absl::Seconds(1);
      for (const auto& [key, t] : client_transfers_) next = std::min(next, t.expires);
      mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; },
                           std::max(next - absl::Now(), absl::ZeroDuration()));
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (auto it = client_transfers_.begin(); it != client_transfers_.end();) {
        auto next_it = std::next(it);
        if (it->second.expires <= now) expired.push_back(TakeClientTransfer(it));
        it = next_it;
      }
    }
    const absl::Status late = absl::DeadlineExceededError(
        "bulk stream: no client began the transfer in time");
    for (ClientTransfer& t : expired) t.done(late);
  }
}

uint64_t BulkServer::Offer(std::shared_ptr<const void> keep, const char* data, size_t size,
                           absl::AnyInvocable<void(const absl::Status&)> done) {
  uint64_t ticket;
  {
    pw::MutexLock lock(&mu_);
    ticket = next_ticket_++;
    if (!stopping_) {
      offers_.emplace(ticket, Offered{std::move(keep), data, size, std::move(done)});
      return ticket;
    }
  }
  done(absl::CancelledError("the worker's bulk server stopped"));
  return ticket;
}

void BulkServer::Withdraw(uint64_t ticket) {
  Offered o;
  {
    pw::MutexLock lock(&mu_);
    auto it = offers_.find(ticket);
    if (it == offers_.end()) return;
    o = std::move(it->second);
    offers_.erase(it);
  }
  o.done(absl::CancelledError("the shard's fetch ended before its bytes were read"));
}

size_t BulkServer::open_offers() const {
  pw::MutexLock lock(&mu_);
  return offers_.size();
}

void BulkServer::AcceptLoop() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      {
        pw::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      // Out of fds, say: let some close first.
      if (err != EINTR && err != ECONNABORTED) absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    Reap();
    absl::Status refused;
    {
      pw::MutexLock lock(&mu_);
      if (stopping_) {
        close(fd);
        return;
      }
      if (connections_.size() >= kMaxConnections) {
        refused = absl::ResourceExhaustedError(absl::StrCat(
            "bulk stream: this worker already serves ", kMaxConnections, " connections"));
      } else {
        if (unauthenticated_ >= kMaxUnauthenticated) {
          // The oldest connection still silent makes room (its hello read fails, it ends).
          for (Connection& old : connections_) {
            if (old.greeted) continue;
            old.greeted = true;
            shutdown(old.fd, SHUT_RDWR);
            break;
          }
        }
        ++unauthenticated_;
        bulk::Configure(fd, kHelloSeconds);
        Connection& c = connections_.emplace_back();
        c.fd = fd;
        c.thread = std::thread([this, &c] {
          Serve(&c);
          shutdown(c.fd, SHUT_RDWR);  // The peer sees the end now; the fd closes when reaped.
          c.finished.store(true, std::memory_order_release);
        });
      }
    }
    if (!refused.ok()) {
      bulk::Configure(fd, 1);
      bulk::Conn plain(fd);
      if (tls_ == nullptr) (void)bulk::SendStatus(plain, refused);  // With TLS: just the close.
      // Unread input (the hello) would turn the close into a reset that loses the reply: read
      // what has come, a bounded amount, without waiting.
      shutdown(fd, SHUT_WR);
      char drain[4096];
      for (int i = 0; i < 4 && recv(fd, drain, sizeof(drain), MSG_DONTWAIT) > 0; ++i) {
      }
      close(fd);
    }
  }
}

void BulkServer::Reap() {
  std::list<Connection> finished;
  {
    pw::MutexLock lock(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (it->finished.load(std::memory_order_acquire))
        finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (Connection& c : finished) {
    c.thread.join();
    close(c.fd);
  }
}

void BulkServer::Serve(Connection* c) {
  // The TLS handshake, then the hello, within the hello's time (the socket's timeout).
  const absl::Time deadline = absl::Now() + absl::Seconds(kHelloSeconds);
  absl::StatusOr<std::unique_ptr<bulk::Conn>> conn =
      tls_ == nullptr ? std::make_unique<bulk::Conn>(c->fd) : tls_->Accept(c->fd);
  absl::StatusOr<std::string> said = conn.ok() ? ReadHello(**conn, deadline) : conn.status();
  // The cluster token: a peer; else a client transfer's key (taken: one use).
  bool peer = false;
  std::optional<ClientTransfer> transfer;
  absl::Status refusal = absl::UnauthenticatedError(
      "bulk stream: missing or wrong cluster token or transfer key (a transfer key is good for "
      "one transfer, until it expires)");
  {
    pw::MutexLock lock(&mu_);
    --unauthenticated_;
    c->greeted = true;
    if (said.ok()) peer = SecretEquals(*said, token_);
    auto it = said.ok() && !peer ? client_transfers_.find(*said) : client_transfers_.end();
    if (it != client_transfers_.end()) {
      if (client_connections_ >= limits_.max_client_connections) {
        refusal = absl::ResourceExhaustedError(absl::StrCat(
            "bulk stream: this worker already serves ", limits_.max_client_connections,
            " clients' transfers; the key stays good until it expires: try again"));
      } else {
        transfer = TakeClientTransfer(it);
        ++client_connections_;
      }
    }
  }
  if (!said.ok()) return;
  bulk::Conn& fd = **conn;
  if (!peer && !transfer.has_value()) {
    (void)Refuse(fd, refusal);
    return;
  }
  absl::Status s = bulk::SendStatus(fd, absl::OkStatus());
  if (s.ok()) bulk::Configure(c->fd, kProgressSeconds);
  if (peer) {
    if (s.ok()) ServePeer(fd);
    return;
  }
  s = s.ok() ? ServeClient(fd, *transfer)
             : absl::UnavailableError("bulk stream: the client went away");
  {
    pw::MutexLock lock(&mu_);
    --client_connections_;  // Before `done`: whoever it wakes finds the room.
  }
  transfer->done(s);
}

absl::Status BulkServer::ServeClient(bulk::Conn& fd, const ClientTransfer& t) {
  if (t.dst == nullptr) {
    absl::Status s = bulk::SendU64(fd, t.size, "sending a shard's size");
    if (s.ok()) s = bulk::SendAll(fd, t.data, t.size, "sending a shard to a client");
    if (s.ok()) sent_bytes_.fetch_add(static_cast<int64_t>(t.size), std::memory_order_relaxed);
    return s;
  }
  // A write: the client says the size, which must be the shard's (answered before it sends the
  // bytes), then sends them; the last answer says whether they were taken.
  uint64_t size = 0;
  PW_RETURN_IF_ERROR(bulk::RecvU64(fd, &size, "reading an upload's size"));
  if (size != t.size) {
    return Refuse(fd, absl::InvalidArgumentError(absl::StrCat(
                          "bulk stream: an upload of ", size, " bytes to a shard of ", t.size)));
  }
  PW_RETURN_IF_ERROR(bulk::SendStatus(fd, absl::OkStatus()));
  PW_RETURN_IF_ERROR(bulk::RecvAll(fd, t.dst, t.size, "reading a client's upload"));
  PW_RETURN_IF_ERROR(bulk::SendStatus(fd, absl::OkStatus()));
  received_bytes_.fetch_add(static_cast<int64_t>(t.size), std::memory_order_relaxed);
  return absl::OkStatus();
}

void BulkServer::ServePeer(bulk::Conn& fd) {
  while (true) {
    uint64_t ticket;
    if (!bulk::RecvU64(fd, &ticket, "reading a ticket").ok()) return;
    Offered o;
    bool found = false;
    {
      pw::MutexLock lock(&mu_);
      auto it = offers_.find(ticket);
      if (it != offers_.end()) {
        o = std::move(it->second);
        offers_.erase(it);
        found = true;
      }
    }
    if (!found) {
      const absl::Status nf = absl::NotFoundError(absl::StrCat(
          "bulk stream: no shard is offered under ticket ", ticket,
          " (withdrawn, already read, or never offered)"));
      if (!bulk::SendStatus(fd, nf).ok()) return;
      continue;
    }
    absl::Status s = bulk::SendStatus(fd, absl::OkStatus());
    if (s.ok()) s = bulk::SendU64(fd, o.size, "sending a shard's size");
    if (s.ok()) s = bulk::SendAll(fd, o.data, o.size, "sending a shard");
    if (s.ok()) sent_bytes_.fetch_add(static_cast<int64_t>(o.size), std::memory_order_relaxed);
    o.done(s);
    if (!s.ok()) return;
  }
}

}  // namespace pw::dataplane
