// ClientSession: a client's side of its Session stream to the controller (RemoteController's).
//
// The stream carries the client's calls that must stay in order (runs and releases) and brings
// back each run's acceptance and end. Submit and Release only queue a message: neither waits for
// the controller, so a client pipelines its calls (a run naming the outputs of one sent before it
// reaches the controller after it). Releases queued back to back go as one message. When the
// stream ends, every run still pending fails with the reason. Callbacks of the futures it fulfils
// run on gRPC's threads (they must not block). Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/rpc/proto/pathways.grpc.pb.h"
#include "pw/transport/controller_interface.h"

namespace pw::rpc {

class ClientSession {
 public:
  // Opens the stream for `client` (its first message names it); `prepare` adds the call's
  // credentials. `where` names the controller in errors.
  ClientSession(::pathways::v1::Controller::Stub* stub, ClientId client,
                const std::function<void(grpc::ClientContext*)>& prepare, std::string where);
  // Close()s.
  ~ClientSession();
  ClientSession(const ClientSession&) = delete;
  ClientSession& operator=(const ClientSession&) = delete;

  // Sends the run (its `seq` is set here); ready when the controller accepted it (RunInfo::done:
  // its end) or refused it.
  Future<RunInfo> Submit(::pathways::v1::SubmitRequest req);
  void Release(BufferId id);
  // Ends the stream (the controller then disconnects the client) and waits until gRPC is done
  // with it; after `grace` without the controller's answer, cancels it. Idempotent.
  void Close(absl::Duration grace = absl::Seconds(5));

 private:
  class Stream;
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace pw::rpc
