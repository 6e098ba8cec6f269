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

// Holds off the end of serving `address` (InProcessName's destructor waits) while a call to it is
// created and runs: Debian's gRPC (1.51) crashes on a call created on an in-process channel
// after its server shut down (grpc/grpc#38645, fixed upstream in 1.71). A caller that calls on
// its own clock, not in answer to the server (the worker's heartbeat), makes its call while one
// of these says ok(); the others call servers their tests keep serving. Not in process: always
// ok(), holding nothing.
class InProcessCall {
 public:
  explicit InProcessCall(std::string address);
  ~InProcessCall();
  InProcessCall(const InProcessCall&) = delete;
  InProcessCall& operator=(const InProcessCall&) = delete;
  // False: `address` is in process and no longer served; do not call it.
  bool ok() const { return ok_; }

 private:
  const std::string address_;
  bool held_ = false;  // Counted on the served name.
  bool ok_ = true;
};

// Whether a server of this process serves `address` now.
bool InProcessServed(const std::string& address);

// A channel to the server of this process registered as `address`, with `args`. (Such a channel
// has no connectivity state to watch: see WaitForConnected in auth.h.)
std::shared_ptr<grpc::Channel> InProcessChannel(const std::string& address,
                                                const grpc::ChannelArguments& args);

}  // namespace pw::rpc
