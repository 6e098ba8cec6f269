// Serving without sockets, for tests: a server started on "inproc:NAME" listens on no port, and
// a channel to "inproc:NAME" made in the same process reaches it through gRPC's in-process
// transport. Every message is still serialized, checked against its limits, parsed and validated
// by the services as it is on the wire (tokens, client keys, malformed bodies); only the socket is
// gone. A name is served by one server at a time; each registration is a new generation.
//
// Unlike a TCP channel, an in-process channel is bound to the server it was made to:
// - made while no server holds the name, it fails every call UNAVAILABLE ("no server of this
//   process serves inproc:NAME"), even after a server takes the name;
// - made to a server that has since shut down, a new call on it crashes Debian's gRPC (1.51;
//   grpc/grpc#38645, fixed upstream in 1.71). A caller that calls on its own clock, not in answer
//   to the server (the worker's heartbeat), makes each call while an InProcessCall for the
//   channel's generation says ok(). Other callers call servers that the tests keep serving while
//   they run (teardown: clients, then the controller, then the workers).
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace pw::rpc {

inline constexpr absl::string_view kInProcessScheme = "inproc:";

// Whether `address` is "inproc:NAME" (a nonempty NAME).
bool IsInProcess(absl::string_view address);

// `server` reachable as `address` ("inproc:NAME") while this lives; drop it before shutting the
// server down (Serving does). The destructor waits until no InProcessCall holds the name.
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

// Holds off the end of serving `address` while a call made in its scope runs, if the server of
// generation `generation` (InProcessChannel's) still serves it; then ok(). Not in process: ok(),
// holding nothing.
class InProcessCall {
 public:
  InProcessCall(std::string address, uint64_t generation);
  ~InProcessCall();
  InProcessCall(const InProcessCall&) = delete;
  InProcessCall& operator=(const InProcessCall&) = delete;
  // False: the channel's server no longer serves `address`; do not call on it.
  bool ok() const { return ok_; }

 private:
  const std::string address_;
  bool held_ = false;  // Counted on the served name.
  bool ok_ = true;
};

// Whether the server of generation `generation` (InProcessChannel's) still serves `address`.
bool InProcessServes(const std::string& address, uint64_t generation);

// A channel to the server of this process registered as `address`, with `args`, and that
// registration's generation (0: none, the channel fails every call). Such a channel has no
// connectivity state to watch: see WaitForConnected in auth.h.
std::pair<std::shared_ptr<grpc::Channel>, uint64_t> InProcessChannel(
    const std::string& address, const grpc::ChannelArguments& args);

}  // namespace pw::rpc
