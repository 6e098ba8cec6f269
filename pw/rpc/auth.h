// Authentication and channel settings of the gRPC transport.
//
// Servers listen on loopback by default. Listening on any other address requires a shared token
// (--token / PW_TOKEN); every call then carries it as "authorization: Bearer <token>" metadata and
// calls without it are refused with UNAUTHENTICATED. Per-client keys (ConnectResponse.client_key,
// sent as "pw-client-key") stop one client from acting as another. Thread-safe pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace pw::rpc {

inline constexpr int64_t kDefaultMaxMessageBytes = int64_t{1} << 30;

struct ChannelOptions {
  std::string token;                            // Empty: no authentication.
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
};

// Adds the token (if any) to an outgoing call.
void AddToken(grpc::ClientContext* ctx, const std::string& token);
// OK when `token` is empty or the call carries it.
absl::Status CheckToken(const grpc::ServerContextBase* ctx, const std::string& token);
// The value of metadata `key` on an incoming call, or "".
std::string Metadata(const grpc::ServerContextBase* ctx, absl::string_view key);

// Whether "host:port" names a loopback address (127.0.0.0/8, ::1, localhost).
bool IsLoopback(absl::string_view address);
// Listening on a non-loopback address needs a token.
absl::Status CheckListenAddress(absl::string_view address, const std::string& token);

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const ChannelOptions& o);
// Serves `service` on `listen` ("host:port"; port 0: any free port) with the message limit.
struct Serving {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // The bound port.
};
absl::StatusOr<Serving> StartServer(const std::string& listen, const ChannelOptions& o,
                                    grpc::Service* service);

// A random key for a client (hex, 128 bits).
std::string NewClientKey();

}  // namespace pw::rpc
