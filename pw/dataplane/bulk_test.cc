#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/base/future.h"
#include "pw/dataplane/bulk_client.h"
#include "pw/dataplane/bulk_server.h"
#include "pw/dataplane/bulk_wire.h"
#include "pw/dataplane/tls_testing.h"

namespace pw::dataplane {
namespace {

constexpr char kToken[] = "cluster-token";

std::shared_ptr<std::vector<char>> Pattern(size_t n, int seed) {
  auto v = std::make_shared<std::vector<char>>(n);
  for (size_t i = 0; i < n; ++i) (*v)[i] = static_cast<char>(i * 131 + seed);
  return v;
}

// Offers `bytes`; the returned future is the offer's outcome.
Future<> Offer(BulkServer& server, const std::shared_ptr<std::vector<char>>& bytes,
               uint64_t* ticket) {
  Promise<> p;
  Future<> f = p.future();
  *ticket = server.Offer(bytes, bytes->data(), bytes->size(),
                         [p = std::move(p)](const absl::Status& s) mutable { p.Set(s); });
  return f;
}

Future<> Read(BulkClient& client, int port, uint64_t ticket, void* dst, size_t size) {
  Promise<> p;
  Future<> f = p.future();
  client.Read(port, ticket, dst, size,
              [p = std::move(p)](const absl::Status& s) mutable { p.Set(s); });
  return f;
}

// A raw TCP connection to 127.0.0.1:port, or -1.
int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

// A raw connection to the server: sends `bytes`, returns the status the server answers (or the
// transport's error).
absl::Status RawHello(int port, const std::string& bytes) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return absl::UnavailableError("connect");
  bulk::Configure(fd, 5);
  absl::Status got;
  bulk::Conn conn(fd);
  absl::Status s = bulk::SendAll(conn, bytes.data(), bytes.size(), "test hello");
  if (s.ok()) s = bulk::RecvStatus(conn, &got);
  close(fd);
  return s.ok() ? got : s;
}

std::string Hello(uint32_t version, const std::string& token) {
  std::string h(bulk::kMagic, 4);
  const uint32_t len = static_cast<uint32_t>(token.size());
  h.append(reinterpret_cast<const char*>(&version), 4);
  h.append(reinterpret_cast<const char*>(&len), 4);
  return h + token;
}

TEST(BulkTest, ReadsOfferedBytesIntoTheDestination) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  BulkClient client("127.0.0.1", kToken);
  const auto bytes = Pattern(3 << 20, 7);
  uint64_t ticket;
  Future<> sent = Offer(**server, bytes, &ticket);
  EXPECT_NE(ticket, 0u);
  std::vector<char> dst(bytes->size());
  ASSERT_TRUE(Read(client, (*server)->port(), ticket, dst.data(), dst.size()).Await().ok());
  EXPECT_TRUE(sent.Await().ok());
  EXPECT_EQ(dst, *bytes);
  EXPECT_EQ((*server)->open_offers(), 0u);
  // A ticket is read once.
  absl::Status again = Read(client, (*server)->port(), ticket, dst.data(), dst.size()).Await();
  EXPECT_TRUE(absl::IsNotFound(again)) << again;
  EXPECT_NE(again.message().find(absl::StrCat(ticket)), std::string::npos) << again;
}

std::shared_ptr<const TlsContext> Context(const std::shared_ptr<const Tls>& tls, bool server) {
  auto ctx = TlsContext::Create(*tls, server);
  return ctx.ok() ? *ctx : nullptr;
}

// Issue 20 (TLS off loopback): the bulk stream under mutual TLS reads as before; a reader without
// TLS, with a certificate of another CA, or dialling a name the server's certificate lacks, is
// refused, and the offer stays for a good reader.
TEST(BulkTest, TlsReadsAndRefusesReadersOutsideTheCluster) {
  auto cluster = MakeTestCerts("cluster", "localhost 127.0.0.1");
  auto other = MakeTestCerts("other", "localhost 127.0.0.1");
  auto misnamed = MakeTestCerts("misnamed", "10.9.9.9");
  ASSERT_TRUE(cluster && other && misnamed) << "scripts/tls-certs.sh failed";
  auto server = BulkServer::Start("127.0.0.1", 0, kToken, Context(cluster, true));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const auto bytes = Pattern(3 << 20, 5);
  uint64_t ticket;
  Future<> sent = Offer(**server, bytes, &ticket);
  std::vector<char> dst(bytes->size());
  {
    BulkClient plain("127.0.0.1", kToken);
    EXPECT_FALSE(Read(plain, port, ticket, dst.data(), dst.size()).Await().ok());
  }
  {
    BulkClient stranger("127.0.0.1", kToken, Context(other, false));
    absl::Status s = Read(stranger, port, ticket, dst.data(), dst.size()).Await();
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
    EXPECT_NE(s.message().find("TLS handshake"), std::string::npos) << s;
  }
  {
    // A server whose certificate names only 10.9.9.9, dialled as 127.0.0.1 by a reader that
    // trusts its CA: refused, as the name is checked.
    auto wrong_name = BulkServer::Start("127.0.0.1", 0, kToken, Context(misnamed, true));
    ASSERT_TRUE(wrong_name.ok()) << wrong_name.status();
    uint64_t t2;
    Future<> sent2 = Offer(**wrong_name, bytes, &t2);
    BulkClient reader("127.0.0.1", kToken, Context(misnamed, false));
    absl::Status s = Read(reader, (*wrong_name)->port(), t2, dst.data(), dst.size()).Await();
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
    EXPECT_NE(s.message().find("mismatch"), std::string::npos) << s;
  }
  {
    // One name for the cluster (--tls-server-name), checked instead of the address dialled.
    auto named = MakeTestCerts("named", "pathways-cluster");
    ASSERT_TRUE(named != nullptr);
    Tls as_cluster = *named;
    as_cluster.server_name = "pathways-cluster";
    auto by_name = BulkServer::Start("127.0.0.1", 0, kToken, Context(named, true));
    ASSERT_TRUE(by_name.ok()) << by_name.status();
    uint64_t t3;
    Future<> sent3 = Offer(**by_name, bytes, &t3);
    BulkClient reader("127.0.0.1", kToken,
                      Context(std::make_shared<const Tls>(as_cluster), false));
    EXPECT_TRUE(Read(reader, (*by_name)->port(), t3, dst.data(), dst.size()).Await().ok());
    EXPECT_EQ(dst, *bytes);
  }
  EXPECT_EQ((*server)->open_offers(), 1u);
  BulkClient member("127.0.0.1", kToken, Context(cluster, false));
  ASSERT_TRUE(Read(member, port, ticket, dst.data(), dst.size()).Await().ok());
  EXPECT_TRUE(sent.Await().ok());
  EXPECT_EQ(dst, *bytes);
  // Pooled TLS connections serve later reads too.
  for (int i = 0; i < 3; ++i) {
    Future<> more = Offer(**server, bytes, &ticket);
    std::fill(dst.begin(), dst.end(), 0);
    ASSERT_TRUE(Read(member, port, ticket, dst.data(), dst.size()).Await().ok());
    EXPECT_EQ(dst, *bytes);
  }
}

TEST(BulkTest, TlsFilesAreCheckedWhenLoadedNamingTheFlag) {
  auto missing = LoadTls({"/nonexistent/cert.pem", "/nonexistent/key.pem", "/nonexistent/ca.pem"},
                         true);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("--tls-ca"), std::string::npos) << missing.status();
  auto half = LoadTls({"", "", "/x/ca.pem"}, /*server=*/true);
  EXPECT_TRUE(absl::IsInvalidArgument(half.status())) << half.status();
  ASSERT_TRUE(MakeTestCerts("swap", "localhost") != nullptr);
  TlsFiles swapped = TestTlsFiles("swap");
  swapped.key = swapped.ca.substr(0, swapped.ca.size() - 6) + "ca-key.pem";
  // A key that is not the certificate's (the CA's key) is refused.
  auto mismatched = LoadTls(swapped, true);
  EXPECT_TRUE(absl::IsInvalidArgument(mismatched.status())) << mismatched.status();
  EXPECT_NE(mismatched.status().message().find("does not match"), std::string::npos)
      << mismatched.status();
  EXPECT_EQ(LoadTls({}, true)->get(), nullptr);  // No TLS asked for.
}

TEST(BulkTest, ManyReadsAtOnceShareAFewThreads) {
  auto server = BulkServer::Start("localhost", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  BulkClient client("localhost", kToken);
  constexpr int kReads = 24;
  std::vector<std::shared_ptr<std::vector<char>>> src;
  std::vector<std::vector<char>> dst(kReads);
  std::vector<Future<>> sent, read;
  for (int i = 0; i < kReads; ++i) {
    src.push_back(Pattern(64 * 1024 + i, i));
    dst[i].resize(src[i]->size());
    uint64_t ticket;
    sent.push_back(Offer(**server, src[i], &ticket));
    read.push_back(Read(client, (*server)->port(), ticket, dst[i].data(), dst[i].size()));
  }
  for (int i = 0; i < kReads; ++i) {
    ASSERT_TRUE(read[i].Await().ok()) << i;
    EXPECT_TRUE(sent[i].Await().ok()) << i;
    EXPECT_EQ(dst[i], *src[i]) << i;
  }
  EXPECT_LE(client.threads(), BulkClient::kMaxThreads);
  EXPECT_GE(client.threads(), 1);
}

TEST(BulkTest, WrongTokenIsRefusedAndTheOfferStays) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto bytes = Pattern(1000, 1);
  uint64_t ticket;
  Future<> sent = Offer(**server, bytes, &ticket);
  std::vector<char> dst(bytes->size());
  {
    BulkClient intruder("127.0.0.1", "not-the-token");
    absl::Status s = Read(intruder, (*server)->port(), ticket, dst.data(), dst.size()).Await();
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  }
  {
    BulkClient empty("127.0.0.1", "");
    EXPECT_TRUE(absl::IsUnauthenticated(
        Read(empty, (*server)->port(), ticket, dst.data(), dst.size()).Await()));
  }
  EXPECT_EQ((*server)->open_offers(), 1u);
  BulkClient client("127.0.0.1", kToken);
  ASSERT_TRUE(Read(client, (*server)->port(), ticket, dst.data(), dst.size()).Await().ok());
  EXPECT_TRUE(sent.Await().ok());
  EXPECT_EQ(dst, *bytes);
  EXPECT_TRUE(absl::IsInvalidArgument(BulkServer::Start("127.0.0.1", 0, "").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BulkServer::Start("127.0.0.1", 70000, kToken).status()));
  // A port in use is refused, naming it.
  auto taken = BulkServer::Start("127.0.0.1", (*server)->port(), kToken);
  EXPECT_TRUE(absl::IsUnavailable(taken.status())) << taken.status();
  EXPECT_NE(taken.status().message().find(absl::StrCat((*server)->port())), std::string::npos);
}

TEST(BulkTest, MalformedHellosGetErrorsAndTheServerKeepsServing) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  absl::Status magic = RawHello(port, "HTTP/1.1 GET /\r\n\r\n");
  EXPECT_TRUE(absl::IsInvalidArgument(magic)) << magic;
  absl::Status version = RawHello(port, Hello(99, kToken));
  EXPECT_TRUE(absl::IsFailedPrecondition(version)) << version;
  EXPECT_NE(version.message().find("99"), std::string::npos) << version;
  std::string huge = Hello(bulk::kVersion, "");
  const uint32_t len = 1u << 30;
  std::memcpy(huge.data() + 8, &len, 4);
  absl::Status too_long = RawHello(port, huge);
  EXPECT_TRUE(absl::IsInvalidArgument(too_long)) << too_long;
  // Truncated hellos and silent connections: closed, never a crash.
  for (int i = 0; i < 8; ++i) {
    const int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    if (i % 2 == 1) {
      ASSERT_EQ(write(fd, "PWB", 3), 3);
    }
    close(fd);
  }
  EXPECT_TRUE(RawHello(port, Hello(bulk::kVersion, kToken)).ok());
  // Still serving.
  BulkClient client("127.0.0.1", kToken);
  const auto bytes = Pattern(4096, 3);
  uint64_t ticket;
  Future<> sent = Offer(**server, bytes, &ticket);
  std::vector<char> dst(bytes->size());
  ASSERT_TRUE(Read(client, port, ticket, dst.data(), dst.size()).Await().ok());
  EXPECT_EQ(dst, *bytes);
}

TEST(BulkTest, UnknownTicketsAndWrongSizesAreErrors) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  BulkClient client("127.0.0.1", kToken);
  const int port = (*server)->port();
  std::vector<char> dst(1 << 16);
  absl::Status unknown = Read(client, port, 12345, dst.data(), dst.size()).Await();
  EXPECT_TRUE(absl::IsNotFound(unknown)) << unknown;
  // The size the server offers must be the reader's.
  const auto bytes = Pattern(1000, 5);
  uint64_t ticket;
  Offer(**server, bytes, &ticket);
  absl::Status wrong = Read(client, port, ticket, dst.data(), 2000).Await();
  EXPECT_TRUE(absl::IsDataLoss(wrong)) << wrong;
  EXPECT_NE(wrong.message().find("1000"), std::string::npos) << wrong;
  // A withdrawn offer ends Cancelled and cannot be read.
  Future<> withdrawn = Offer(**server, bytes, &ticket);
  (*server)->Withdraw(ticket);
  EXPECT_TRUE(absl::IsCancelled(withdrawn.Await()));
  EXPECT_TRUE(absl::IsNotFound(Read(client, port, ticket, dst.data(), 1000).Await()));
  // The client still reads after those errors.
  Future<> sent = Offer(**server, bytes, &ticket);
  ASSERT_TRUE(Read(client, port, ticket, dst.data(), 1000).Await().ok());
  EXPECT_EQ(std::memcmp(dst.data(), bytes->data(), 1000), 0);
}

TEST(BulkTest, StoppingEndsOffersAndReads) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  BulkClient client("127.0.0.1", kToken);
  const auto bytes = Pattern(100, 9);
  uint64_t ticket;
  Future<> first = Offer(**server, bytes, &ticket);
  std::vector<char> dst(100);
  ASSERT_TRUE(Read(client, port, ticket, dst.data(), 100).Await().ok());  // Opens a connection.
  Future<> open = Offer(**server, bytes, &ticket);
  server->reset();  // Closes the idle connection too.
  EXPECT_TRUE(absl::IsCancelled(open.Await()));
  absl::Status gone = Read(client, port, ticket, dst.data(), 100).Await();
  EXPECT_TRUE(absl::IsUnavailable(gone)) << gone;  // The retry on a new connection fails too.
  // A client closed from a read's own callback (its last owner) neither hangs nor crashes.
  auto again = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(again.ok());
  auto owned = std::make_shared<BulkClient>("127.0.0.1", kToken);
  Future<> offered = Offer(**again, bytes, &ticket);
  Promise<> p;
  Future<> done = p.future();
  owned->Read((*again)->port(), ticket, dst.data(), 100,
              [owner = owned, p = std::move(p)](const absl::Status& s) mutable {
                p.Set(s);
                owner.reset();
              });
  owned.reset();
  EXPECT_TRUE(done.Await().ok());
  EXPECT_TRUE(offered.Await().ok());
}

TEST(BulkTest, APooledConnectionTheServerClosedIsReplacedOnce) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  BulkClient client("127.0.0.1", kToken);
  const auto bytes = Pattern(5000, 4);
  std::vector<char> dst(bytes->size());
  // Two reads at once leave two pooled connections.
  uint64_t t1, t2;
  Offer(**server, bytes, &t1);
  Offer(**server, bytes, &t2);
  Future<> r1 = Read(client, port, t1, dst.data(), dst.size());
  std::vector<char> dst2(bytes->size());
  Future<> r2 = Read(client, port, t2, dst2.data(), dst2.size());
  ASSERT_TRUE(r1.Await().ok() && r2.Await().ok());
  // A new server on the same port: both pooled connections are dead.
  server->reset();
  auto restarted = BulkServer::Start("127.0.0.1", port, kToken);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  uint64_t ticket;
  Future<> sent = Offer(**restarted, bytes, &ticket);
  std::fill(dst.begin(), dst.end(), 0);
  absl::Status s = Read(client, port, ticket, dst.data(), dst.size()).Await();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(sent.Await().ok());
  EXPECT_EQ(dst, *bytes);
}

TEST(BulkTest, ConnectionsThatNeverSayHelloCannotCrowdOutPeers) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> silent;
  for (int i = 0; i < BulkServer::kMaxUnauthenticated; ++i) {
    const int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  // Issue 20: with the server full of silent connections (none needs a token), a peer was
  // refused until they timed out. Each hello now closes the oldest silent one instead.
  for (int i = 0; i < 3; ++i) {
    const absl::Status s = RawHello(port, Hello(bulk::kVersion, kToken));
    EXPECT_TRUE(s.ok()) << s;
  }
  // The oldest silent connections were closed by the server: their reads see the end.
  char byte;
  EXPECT_EQ(recv(silent[0], &byte, 1, 0), 0) << "the oldest silent connection is still open";
  for (int fd : silent) close(fd);
}
}  // namespace
}  // namespace pw::dataplane

namespace pw::dataplane {
namespace {

constexpr char kKey[] = "0123456789abcdef0123456789abcdef";

Future<> ClientRead(BulkClient& c, int port, const std::string& key, void* dst, size_t size) {
  Promise<> p;
  Future<> f = p.future();
  c.ReadTransfer(port, key, dst, size, [p = std::move(p)](const absl::Status& s) mutable { p.Set(s); });
  return f;
}
Future<> ClientWrite(BulkClient& c, int port, const std::string& key, const void* src,
                     size_t size) {
  Promise<> p;
  Future<> f = p.future();
  c.WriteTransfer(port, key, src, size,
                  [p = std::move(p)](const absl::Status& s) mutable { p.Set(s); });
  return f;
}
// Accepts an upload of `size` bytes for `owner`; the future holds them once they arrived.
Future<std::vector<uint8_t>> Accept(BulkServer& server, const std::string& key, size_t size,
                                    absl::Time expires, int64_t owner = 1) {
  Promise<std::vector<uint8_t>> p;
  Future<std::vector<uint8_t>> f = p.future();
  auto dst = std::make_shared<std::vector<uint8_t>>(size);
  char* data = reinterpret_cast<char*>(dst->data());
  auto landed = std::make_shared<Promise<std::vector<uint8_t>>>(std::move(p));
  const absl::Status accepted = server.AcceptFromClient(
      key, owner, dst, data, size, expires, [landed, dst](const absl::Status& s) {
        if (!s.ok()) return landed->Set(s);
        landed->Set(std::move(*dst));
      });
  if (!accepted.ok()) landed->Set(accepted);
  return f;
}

// Issue 23 (client I/O beside the controller): a client without the cluster token reads and
// writes a shard under the transfer's key, once; other keys and tokens are refused.
TEST(BulkClientTransferTest, AClientReadsAndWritesUnderTheKeyOnce) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const auto bytes = Pattern(3 << 20, 5);
  Promise<> offered;
  Future<> offer_done = offered.future();
  ASSERT_TRUE((*server)
                  ->OfferToClient(kKey, 1, bytes, bytes->data(), bytes->size(),
                                  absl::Now() + absl::Minutes(1),
                                  [p = std::move(offered)](const absl::Status& s) mutable {
                                    p.Set(s);
                                  })
                  .ok());
  BulkClient client("127.0.0.1", "");
  std::vector<char> dst(bytes->size());
  // A wrong key, and the cluster token's holders' protocol, do not reach it.
  absl::Status wrong =
      ClientRead(client, port, std::string(32, 'x'), dst.data(), dst.size()).Await();
  EXPECT_TRUE(absl::IsUnauthenticated(wrong)) << wrong;
  EXPECT_EQ((*server)->open_client_transfers(), 1u);
  ASSERT_TRUE(ClientRead(client, port, kKey, dst.data(), dst.size()).Await().ok());
  EXPECT_EQ(dst, *bytes);
  EXPECT_TRUE(offer_done.Await().ok());
  // One use.
  EXPECT_TRUE(absl::IsUnauthenticated(ClientRead(client, port, kKey, dst.data(), dst.size()).Await()));

  Future<std::vector<uint8_t>> got = Accept(**server, kKey, bytes->size(), absl::Now() + absl::Minutes(1));
  ASSERT_TRUE(ClientWrite(client, port, kKey, bytes->data(), bytes->size()).Await().ok());
  ASSERT_TRUE(got.Await().ok()) << got.Await().status();
  ASSERT_EQ(got.Await()->size(), bytes->size());
  EXPECT_EQ(std::memcmp(got.Await()->data(), bytes->data(), bytes->size()), 0);
  EXPECT_EQ((*server)->open_client_transfers(), 0u);
}

TEST(BulkClientTransferTest, WrongSizesShortKeysAndReusedKeysAreErrors) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  BulkClient client("127.0.0.1", "");
  const auto bytes = Pattern(1000, 2);
  Future<std::vector<uint8_t>> got = Accept(**server, kKey, 800, absl::Now() + absl::Minutes(1));
  absl::Status s = ClientWrite(client, port, kKey, bytes->data(), bytes->size()).Await();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("1000 bytes to a shard of 800"), std::string::npos) << s;
  EXPECT_TRUE(absl::IsInvalidArgument(got.Await().status())) << got.Await().status();
  // Keys too short to be secrets, and keys in use, are refused at once.
  EXPECT_TRUE(absl::IsInvalidArgument(
      Accept(**server, "short", 8, absl::Now() + absl::Minutes(1)).Await().status()));
  Future<std::vector<uint8_t>> first = Accept(**server, kKey, 8, absl::Now() + absl::Minutes(1));
  EXPECT_TRUE(absl::IsAlreadyExists(
      Accept(**server, kKey, 8, absl::Now() + absl::Minutes(1)).Await().status()));
  EXPECT_FALSE(first.AwaitFor(absl::ZeroDuration()));  // The first still waits.
}

TEST(BulkClientTransferTest, TransfersNobodyBeginsExpireAndClientsThatDieMidUploadFailThem) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  Future<std::vector<uint8_t>> late = Accept(**server, kKey, 64, absl::Now() + absl::Milliseconds(50));
  absl::Status s = late.Await().status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ((*server)->open_client_transfers(), 0u);

  // A client that says its size, sends half the bytes and goes.
  const std::string key(32, 'k');
  Future<std::vector<uint8_t>> cut = Accept(**server, key, 1 << 20, absl::Now() + absl::Minutes(1));
  const int fd = ConnectLoopback((*server)->port());
  ASSERT_GE(fd, 0);
  {
    bulk::Configure(fd, 5);
    bulk::Conn conn(fd);
    const std::string hello = Hello(bulk::kVersion, key);
    ASSERT_TRUE(bulk::SendAll(conn, hello.data(), hello.size(), "hello").ok());
    absl::Status answer;
    ASSERT_TRUE(bulk::RecvStatus(conn, &answer).ok());
    ASSERT_TRUE(answer.ok()) << answer;
    ASSERT_TRUE(bulk::SendU64(conn, 1 << 20, "size").ok());
    ASSERT_TRUE(bulk::RecvStatus(conn, &answer).ok());
    ASSERT_TRUE(answer.ok()) << answer;
    std::vector<char> half(1 << 19, 'h');
    ASSERT_TRUE(bulk::SendAll(conn, half.data(), half.size(), "half").ok());
  }
  close(fd);
  s = cut.Await().status();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;

  // Stopping the server fails what is still open, and refuses what comes after (the worker's
  // last callbacks offer on a stopped server: WorkerServer's destructor).
  Future<std::vector<uint8_t>> open = Accept(**server, kKey, 8, absl::Now() + absl::Minutes(1));
  (*server)->Stop();
  EXPECT_TRUE(absl::IsCancelled(open.Await().status())) << open.Await().status();
  EXPECT_TRUE(absl::IsCancelled(
      Accept(**server, kKey, 8, absl::Now() + absl::Minutes(1)).Await().status()));
  uint64_t ticket;
  Future<> offered = Offer(**server, Pattern(8, 1), &ticket);
  ASSERT_TRUE(offered.AwaitFor(absl::ZeroDuration()));
  EXPECT_TRUE(absl::IsCancelled(offered.Await())) << offered.Await();
  server->reset();
}

// Opens a client transfer's connection under `key` and stops after the server's answer to the
// hello (the transfer is then being served, waiting for the size). Returns the fd, or -1.
int BeginAndStall(int port, const std::string& key) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return -1;
  bulk::Configure(fd, 5);
  bulk::Conn conn(fd);
  const std::string hello = Hello(bulk::kVersion, key);
  absl::Status answer;
  if (!bulk::SendAll(conn, hello.data(), hello.size(), "hello").ok() ||
      !bulk::RecvStatus(conn, &answer).ok() || !answer.ok()) {
    close(fd);
    return -1;
  }
  return fd;
}

// Clients' transfers have limits of their own: so many waiting, so many being served; past
// them a client gets ResourceExhausted (the key stays good) and peers still get in.
TEST(BulkClientTransferTest, ClientTransfersPastTheirLimitsAreRefusedAndPeersStillGetIn) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken, nullptr,
                                  {.max_client_transfers = 2, .max_client_connections = 1});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string first(32, 'a'), second(32, 'b');
  const absl::Time later = absl::Now() + absl::Minutes(1);
  Future<std::vector<uint8_t>> stalled = Accept(**server, first, 8, later);
  Future<std::vector<uint8_t>> waiting = Accept(**server, second, 8, later);
  absl::Status third = Accept(**server, std::string(32, 'c'), 8, later).Await().status();
  EXPECT_TRUE(absl::IsResourceExhausted(third)) << third;
  EXPECT_NE(third.message().find("2 clients' transfers"), std::string::npos) << third;

  const int fd = BeginAndStall(port, first);
  ASSERT_GE(fd, 0);
  BulkClient client("127.0.0.1", "");
  const auto bytes = Pattern(8, 3);
  absl::Status busy = ClientWrite(client, port, second, bytes->data(), bytes->size()).Await();
  EXPECT_TRUE(absl::IsResourceExhausted(busy)) << busy;
  EXPECT_EQ((*server)->open_client_transfers(), 1u);  // The second key is still good.
  // A peer is not held up by clients.
  BulkClient peer("127.0.0.1", kToken);
  uint64_t ticket;
  Future<> offered = Offer(**server, bytes, &ticket);
  std::vector<char> got(bytes->size());
  ASSERT_TRUE(Read(peer, port, ticket, got.data(), got.size()).Await().ok());
  EXPECT_EQ(got, *bytes);

  close(fd);  // The stalled client goes: its transfer fails, and makes room for the next.
  EXPECT_TRUE(absl::IsUnavailable(stalled.Await().status())) << stalled.Await().status();
  ASSERT_TRUE(ClientWrite(client, port, second, bytes->data(), bytes->size()).Await().ok());
  ASSERT_TRUE(waiting.Await().ok()) << waiting.Await().status();
  EXPECT_EQ(std::memcmp(waiting.Await()->data(), bytes->data(), bytes->size()), 0);
}

// Transfers nobody has begun hold their shards: withdrawn with their owner (the worker: when
// the array is deleted), and no more bytes of them wait than the server's limit.
TEST(BulkClientTransferTest, WaitingTransfersAreWithdrawnWithTheirOwnerAndTheirBytesCapped) {
  auto server = BulkServer::Start("127.0.0.1", 0, kToken, nullptr, {.max_client_bytes = 100});
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Time later = absl::Now() + absl::Minutes(1);
  Future<std::vector<uint8_t>> a = Accept(**server, std::string(32, 'a'), 40, later, /*owner=*/7);
  Future<std::vector<uint8_t>> b = Accept(**server, std::string(32, 'b'), 40, later, /*owner=*/8);
  absl::Status over = Accept(**server, std::string(32, 'c'), 40, later, 9).Await().status();
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(over.message(), testing::HasSubstr("80 bytes"));
  EXPECT_EQ((*server)->open_client_bytes(), 80);

  const int64_t owners[] = {7, 100};
  (*server)->WithdrawClientTransfers(owners, "its array was deleted");
  ASSERT_TRUE(a.AwaitFor(absl::ZeroDuration()));  // Failed in the call.
  EXPECT_TRUE(absl::IsCancelled(a.Await().status())) << a.Await().status();
  EXPECT_THAT(a.Await().status().message(), testing::HasSubstr("its array was deleted"));
  EXPECT_FALSE(b.AwaitFor(absl::ZeroDuration()));  // Another owner's waits on.
  EXPECT_EQ((*server)->open_client_bytes(), 40);
  // Its room is free again, and its key no longer opens anything.
  Future<std::vector<uint8_t>> c = Accept(**server, std::string(32, 'c'), 60, later, 9);
  EXPECT_FALSE(c.AwaitFor(absl::ZeroDuration()));
  BulkClient client("127.0.0.1", "");
  const auto bytes = Pattern(40, 2);
  absl::Status gone = ClientWrite(client, (*server)->port(), std::string(32, 'a'), bytes->data(),
                                  bytes->size()).Await();
  EXPECT_TRUE(absl::IsUnauthenticated(gone)) << gone;
  ASSERT_TRUE(ClientWrite(client, (*server)->port(), std::string(32, 'b'), bytes->data(),
                          bytes->size()).Await().ok());
  ASSERT_TRUE(b.Await().ok()) << b.Await().status();
  EXPECT_EQ((*server)->open_client_bytes(), 60);
}

}  // namespace
}  // namespace pw::dataplane
