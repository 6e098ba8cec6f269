#include "pw/dataplane/bulk_client.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "pw/base/mutex.h"
#include "pw/base/status_macros.h"
#include "pw/dataplane/bulk_wire.h"

namespace pw::dataplane {
namespace {

constexpr int kConnectSeconds = 10;   // To connect and have the hello answered.
constexpr int kProgressSeconds = 60;  // Then, no progress for this long fails a read.
constexpr int kIdleSeconds = 50;      // Pooled this long, a connection is closed (the server
                                      // closes its end after 60 s without a request).

}  // namespace

struct BulkClient::Job {
  int port;
  uint64_t ticket;
  void* dst;
  size_t size;
  absl::AnyInvocable<void(const absl::Status&)> done;
  std::string key;             // Non-empty: a client's transfer under this key.
  const void* src = nullptr;   // A client's write: its bytes.
};

class BulkClient::State : public std::enable_shared_from_this<State> {
 public:
  State(std::string host, std::string token, std::shared_ptr<const TlsContext> tls)
      : host_(std::move(host)), token_(std::move(token)), tls_(std::move(tls)) {}

  // Queues `job` (moved from) and starts a thread if too few are idle; false if stopped.
  bool Enqueue(Job& job) {
    pw::MutexLock lock(&mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(job));
    if (static_cast<size_t>(idle_threads_) < queue_.size() &&
        static_cast<int>(threads_.size()) < kMaxThreads)
      threads_.emplace_back([self = shared_from_this()] { self->Loop(); });
    return true;
  }

  int threads() const {
    pw::MutexLock lock(&mu_);
    return static_cast<int>(threads_.size());
  }

  void Stop() {
    std::deque<Job> queued;
    std::vector<std::thread> threads;
    {
      pw::MutexLock lock(&mu_);
      stopping_ = true;
      for (int fd : active_) shutdown(fd, SHUT_RDWR);
      queued.swap(queue_);
      threads.swap(threads_);
    }
    for (Job& j : queued) j.done(absl::CancelledError("the bulk reader was closed"));
    for (std::thread& t : threads) {
      if (t.get_id() == std::this_thread::get_id()) {
        t.detach();  // This thread's Loop ends on return: it sees stopping_, and holds State.
      } else {
        t.join();
      }
    }
    pw::MutexLock lock(&mu_);
    for (Idle& i : idle_) Drop(std::move(i.conn));
    idle_.clear();
  }

 private:
  using ConnPtr = std::unique_ptr<bulk::Conn>;
  struct Idle {
    int port;
    ConnPtr conn;
    absl::Time since;
  };
  // Frees the TLS session, then closes the socket.
  static void Drop(ConnPtr conn) {
    const int fd = conn->fd();
    conn.reset();
    close(fd);
  }

  void Loop() {
    while (true) {
      Job job;
      {
        pw::MutexLock lock(&mu_);
        ++idle_threads_;
        mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || !queue_.empty(); });
        --idle_threads_;
        if (stopping_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Status s = Transfer(job);
      job.done(s);
    }
  }

  // A read's size, which must be the job's, then its bytes into the job's destination.
  static absl::Status ReceiveShard(bulk::Conn& conn, const Job& job) {
    uint64_t size = 0;
    PW_RETURN_IF_ERROR(bulk::RecvU64(conn, &size, "reading a shard's size"));
    if (size != job.size)
      return absl::DataLossError(absl::StrCat("the server offers ", size, " bytes, not the ",
                                              job.size, " of the shard's spec"));
    return bulk::RecvAll(conn, job.dst, job.size, "reading a shard");
  }

  // A client's transfer: one connection, one read or write, closed after.
  absl::Status ClientTransfer(const Job& job) {
    const std::string where = absl::StrCat(job.src != nullptr ? "upload to " : "download from ",
                                           host_, ":", job.port);
    absl::StatusOr<ConnPtr> c = Connect(job.port, job.key);
    if (!c.ok()) return Annotate(c.status(), where);
    ConnPtr conn = *std::move(c);
    absl::Status s;
    if (job.src != nullptr) {
      absl::Status got;  // The size taken, then the bytes.
      s = bulk::SendU64(*conn, job.size, "sending an upload's size");
      if (s.ok()) s = bulk::RecvStatus(*conn, &got);
      if (s.ok()) s = got;
      if (s.ok()) s = bulk::SendAll(*conn, job.src, job.size, "sending an upload");
      if (s.ok()) s = bulk::RecvStatus(*conn, &got);
      if (s.ok()) s = got;
    } else {
      s = ReceiveShard(*conn, job);
    }
    Close(std::move(conn));
    return s.ok() ? s : Annotate(s, where);
  }

  absl::Status Transfer(const Job& job) {
    if (!job.key.empty()) return ClientTransfer(job);
    const std::string where =
        absl::StrCat("bulk read of ticket ", job.ticket, " from ", host_, ":", job.port);
    ConnPtr conn = TakeIdle(job.port);
    bool reused = conn != nullptr;
    absl::Status s, got;
    while (true) {
      if (conn == nullptr) {
        absl::StatusOr<ConnPtr> c = Connect(job.port, token_);
        if (!c.ok()) return Annotate(c.status(), where);
        conn = *std::move(c);
      }
      s = bulk::SendU64(*conn, job.ticket, "sending a ticket");
      if (s.ok()) s = bulk::RecvStatus(*conn, &got);
      if (s.ok()) break;
      Close(std::move(conn));
      // A pooled connection the server has closed (idle too long, or it restarted): so may the
      // others to that port be. Once more on a new one.
      if (!reused || !absl::IsUnavailable(s)) return Annotate(s, where);
      DropIdle(job.port);
      reused = false;
    }
    if (!got.ok()) {
      GiveBack(job.port, std::move(conn));
      return Annotate(got, where);
    }
    s = ReceiveShard(*conn, job);
    if (!s.ok()) {
      Close(std::move(conn));
      return Annotate(s, where);
    }
    GiveBack(job.port, std::move(conn));
    return absl::OkStatus();
  }

  // A new connection to `port`, past the TLS handshake (if any) and the hello saying `token`
  // (kConnectSeconds for all of it).
  absl::StatusOr<ConnPtr> Connect(int port, const std::string& token) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string service = absl::StrCat(port);
    if (int e = getaddrinfo(host_.c_str(), service.c_str(), &hints, &found); e != 0)
      return absl::UnavailableError(absl::StrCat("cannot resolve ", host_, ": ", gai_strerror(e)));
    absl::Status why = absl::UnavailableError("no address");
    int fd = -1;
    for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      {
        pw::MutexLock lock(&mu_);
        if (stopping_) {
          close(fd);
          freeaddrinfo(found);
          return absl::CancelledError("the bulk reader was closed");
        }
        active_.insert(fd);
      }
      bulk::Configure(fd, kConnectSeconds);
      if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        why = absl::UnavailableError(absl::StrCat(
            "connect: ", std::strerror(errno),
            " (is the worker's bulk port open? see pw worker --bulk-port)"));
        Close(std::make_unique<bulk::Conn>(fd));
        fd = -1;
      }
    }
    freeaddrinfo(found);
    if (fd < 0) return why;
    absl::StatusOr<ConnPtr> conn =
        tls_ == nullptr ? std::make_unique<bulk::Conn>(fd) : tls_->Connect(fd, host_);
    if (!conn.ok()) {
      Close(std::make_unique<bulk::Conn>(fd));
      return conn.status();
    }
    std::string hello(bulk::kMagic, sizeof(bulk::kMagic));
    const uint32_t version = bulk::kVersion, len = static_cast<uint32_t>(token.size());
    hello.append(reinterpret_cast<const char*>(&version), 4);
    hello.append(reinterpret_cast<const char*>(&len), 4);
    hello += token;
    absl::Status got;
    absl::Status s = bulk::SendAll(**conn, hello.data(), hello.size(), "sending the hello");
    if (s.ok()) s = bulk::RecvStatus(**conn, &got);
    if (s.ok() && !got.ok()) s = Annotate(got, "the server refused the hello");
    if (!s.ok()) {
      Close(*std::move(conn));
      return s;
    }
    bulk::Configure(fd, kProgressSeconds);
    return conn;
  }

  // A pooled connection to `port` (now in active_, so Stop can abort it), or null. Connections
  // idle so long that the server may have closed them are closed instead.
  ConnPtr TakeIdle(int port) {
    pw::MutexLock lock(&mu_);
    if (stopping_) return nullptr;
    const absl::Time stale = absl::Now() - absl::Seconds(kIdleSeconds);
    for (size_t i = 0; i < idle_.size();) {
      if (idle_[i].since < stale) {
        Drop(std::move(idle_[i].conn));
        idle_.erase(idle_.begin() + i);
      } else if (idle_[i].port == port) {
        ConnPtr conn = std::move(idle_[i].conn);
        idle_.erase(idle_.begin() + i);
        active_.insert(conn->fd());
        return conn;
      } else {
        ++i;
      }
    }
    return nullptr;
  }

  void DropIdle(int port) {
    pw::MutexLock lock(&mu_);
    for (size_t i = 0; i < idle_.size();) {
      if (idle_[i].port == port) {
        Drop(std::move(idle_[i].conn));
        idle_.erase(idle_.begin() + i);
      } else {
        ++i;
      }
    }
  }

  void GiveBack(int port, ConnPtr conn) {
    pw::MutexLock lock(&mu_);
    active_.erase(conn->fd());
    if (stopping_) {
      Drop(std::move(conn));
      return;
    }
    idle_.push_back({port, std::move(conn), absl::Now()});
    if (idle_.size() > kMaxThreads) {  // One to a peer's old port, say: the oldest goes.
      Drop(std::move(idle_.front().conn));
      idle_.erase(idle_.begin());
    }
  }

  void Close(ConnPtr conn) {
    pw::MutexLock lock(&mu_);
    active_.erase(conn->fd());
    Drop(std::move(conn));
  }

  const std::string host_;
  const std::string token_;
  const std::shared_ptr<const TlsContext> tls_;
  mutable pw::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  int idle_threads_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<Idle> idle_ ABSL_GUARDED_BY(mu_);  // Open, unused, oldest first.
  absl::flat_hash_set<int> active_ ABSL_GUARDED_BY(mu_);
};

BulkClient::BulkClient(std::string host, std::string token, std::shared_ptr<const TlsContext> tls)
    : state_(std::make_shared<State>(std::move(host), std::move(token), std::move(tls))) {}

BulkClient::~BulkClient() { state_->Stop(); }

void BulkClient::Read(int port, uint64_t ticket, void* dst, size_t size,
                      absl::AnyInvocable<void(const absl::Status&)> done) {
  Job job{port, ticket, dst, size, std::move(done)};
  if (!state_->Enqueue(job)) job.done(absl::CancelledError("the bulk reader was closed"));
}

void BulkClient::ReadTransfer(int port, std::string key, void* dst, size_t size,
                              absl::AnyInvocable<void(const absl::Status&)> done) {
  Job job{port, 0, dst, size, std::move(done), std::move(key)};
  if (!state_->Enqueue(job)) job.done(absl::CancelledError("the bulk reader was closed"));
}

void BulkClient::WriteTransfer(int port, std::string key, const void* src, size_t size,
                               absl::AnyInvocable<void(const absl::Status&)> done) {
  Job job{port, 0, nullptr, size, std::move(done), std::move(key), src};
  if (!state_->Enqueue(job)) job.done(absl::CancelledError("the bulk reader was closed"));
}

int BulkClient::threads() const { return state_->threads(); }

}  // namespace pw::dataplane
