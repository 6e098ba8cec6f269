// ClientSession: a client's side of its Session stream to the controller (RemoteController's).
//
// The stream carries the client's calls that must stay in order (runs and releases) and brings
// back each run's acceptance and end. Submit and Release only queue a message: neither waits for
// the controller, so a client pipelines its calls (a run naming the outputs of one sent before it
// reaches the controller after it). Releases queued back to back go as one message. When the
// stream ends, every run still pending fails with the reason. Callbacks of the futures it fulfils
// run on gRPC's threads, or with mail on the thread of the process's mailbox (they must not
// block). Thread-safe.
//
// With a controller on this machine the session goes by mail both ways once the controller says
// it takes mail (the stream's initial metadata): batches go to the controller's mailbox
// (PeerMail.session), numbered so that the controller handles them in order with any that did
// not fit and went on the stream; events come to this process's mailbox, whose owner hands them
// to OnMailedEvents. The stream stays open: its end still ends the session. A batch is mailed
// only while the session's runs not yet seen ended are fewer than the controller's limit (else
// it goes on the stream, whose reads the controller pauses), so its back-pressure holds.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
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
  // Mail to and from a controller on this machine: this process's mailbox (where the events
  // come), how to open the controller's (its name: a sender, false when a message does not
  // fit), and how to hand on what this process's mailbox holds now, waiting for a delivery in
  // progress (before the session's end fails the runs whose ends may be there).
  struct Mail {
    std::string self_mailbox;
    uint64_t self_key = 0;  // Its ShmMailbox::key: the controller mails only a mailbox it names.
    std::function<absl::StatusOr<std::function<bool(const ::pathways::v1::PeerMail&)>>(
        const std::string& name)>
        open;
    std::function<void()> drain;
  };
  ClientSession(::pathways::v1::Controller::Stub* stub, ClientId client,
                const std::function<void(grpc::ClientContext*)>& prepare, std::string where,
                std::optional<Mail> mail = std::nullopt);
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

  // The session in mail (MailedSession.stub); 0 without Mail.
  uint64_t mail_stub() const;
  // Events the controller mailed to this session.
  void OnMailedEvents(const ::pathways::v1::SessionEventBatch& events);
  // Batches mailed (the rest went on the stream).
  int64_t batches_mailed() const;

 private:
  class Stream;
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace pw::rpc
