// Serving without sockets, for tests: a server started on "inproc:NAME" listens on no port, and
// a channel to "inproc:NAME" made in the same process reaches it through gRPC's in-process
// transport. Every message is still serialized, checked against its limits, parsed and validated
// by the services as it is on the wire (tokens, client keys, malformed bodies); only the socket is
// gone. A name is served once at a time; a channel to a name that no server of this process holds
// fails every call (UNAVAILABLE, naming it). Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace pw::rpc {

inline constexpr absl::string_view kInProcessScheme = "inproc:";

// Whether `address` is "inproc:NAME" (a nonempty NAME).
bool IsInProcess(absl::string_view address);

// `server` reachable as `address` ("inproc:NAME") while this lives; drop it before shutting the
// server down (Serving does).
class InProcessName {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessName>> Register(std::string address,
                                                                 grpc::Server* server);
  ~InProcessName();
  InProcessName(const InProcessName&) = delete;
  InProcessName& operator=(const InProcessName&) = delete;

 private:
  explicit InProcessName(std::string address) : address_(std::move(address)) {}
  const std::string address_;
};

// Whether a server of this process serves `address` now.
bool InProcessServed(const std::string& address);

// A channel to the server of this process registered as `address`, with `args`. (Such a channel
// has no connectivity state to watch: see WaitForConnected in auth.h.)
std::shared_ptr<grpc::Channel> InProcessChannel(const std::string& address,
                                                const grpc::ChannelArguments& args);

}  // namespace pw::rpc
