// Authentication and channel settings of the gRPC transport.
//
// Two credentials, both sent as "authorization: Bearer <token>" metadata:
// - the client token (--token / PW_TOKEN): clients' calls to the controller. Required when the
//   controller listens on a non-loopback address; calls without it get UNAUTHENTICATED.
// - the cluster token (--cluster-token / PW_CLUSTER_TOKEN; `pw up` makes a random one): every
//   call between the controller and workers, and any call to a worker. Only those processes hold
//   it, so a client cannot read shards from a worker, pose as a host, or stop the cluster.
// Per-client keys (ConnectResponse.client_key, sent as "pw-client-key") stop one client from
// acting as another. TLS (tls.h) protects the bytes on the wire; listening off loopback without
// it takes an explicit --insecure. Thread-safe pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "pw/base/secret.h"
#include "pw/dataplane/tls.h"
#include "pw/rpc/in_process.h"

namespace pw::rpc {

inline constexpr int64_t kDefaultMaxMessageBytes = int64_t{1} << 30;

struct ChannelOptions {
  std::string token;  // Sent with every call (client or cluster token); empty: none.
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
  std::shared_ptr<const dataplane::Tls> tls;  // Null: plaintext.
};

// Adds the token (if any) to an outgoing call.
void AddToken(grpc::ClientContext* ctx, const std::string& token);
// OK when `token` is empty or the call carries it.
absl::Status CheckToken(const grpc::ServerContextBase* ctx, const std::string& token);
// The same for the cluster token (its own error message).
absl::Status CheckClusterToken(const grpc::ServerContextBase* ctx, const std::string& token);
// The value of metadata `key` on an incoming call, or "".
std::string Metadata(const grpc::ServerContextBase* ctx, absl::string_view key);

// The host of "host:port" ("[v6]:port" gives the bare v6 address).
std::string HostOf(absl::string_view address);
// Whether "host:port" names a loopback address (127.0.0.0/8, ::1, localhost).
bool IsLoopback(absl::string_view address);
// Listening on a non-loopback address needs a token, and TLS unless `insecure` (--insecure). An
// in-process address (in_process.h) is reachable only from this process, as loopback is from
// this machine.
absl::Status CheckListenAddress(absl::string_view address, const std::string& token,
                                bool tls = false, bool insecure = false);

// A channel to `address`: "host:port", or "inproc:NAME" (in_process.h; no TLS there, as there
// is no wire; `in_process_generation`, if given, gets the generation of the server it reaches,
// for InProcessCall).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const ChannelOptions& o,
                                           uint64_t* in_process_generation = nullptr);
// Whether `channel` (MakeChannel's to `address`) connects by `deadline`; in process, whether the
// server it reaches (`in_process_generation`, MakeChannel's) still serves the name.
bool WaitForConnected(grpc::Channel& channel, const std::string& address,
                      uint64_t in_process_generation, absl::Time deadline);
// Serves `service` on `listen` ("host:port", port 0: any free port; or "inproc:NAME") with the
// message limit.
struct Serving {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // The bound port (0 in process).
  std::unique_ptr<InProcessName> name;  // In process: the name served (dropped first).
  // Stops serving the name (if any; waits for the InProcessCalls holding it), then shuts the
  // server down, pending calls cancelled after `grace`.
  void Shutdown(absl::Duration grace);
};
// With TLS (`o.tls`), the server presents its certificate; `require_peer_certificate`: every
// caller must present one the CA signed (workers: only the controller and peers call them);
// otherwise a certificate a caller presents is verified (the controller's clients need none).
// An in-process server has neither TLS nor a port.
absl::StatusOr<Serving> StartServer(const std::string& listen, const ChannelOptions& o,
                                    grpc::Service* service, bool require_peer_certificate);

}  // namespace pw::rpc
