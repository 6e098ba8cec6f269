// ControllerService: serves a ControllerInterface (the Controller) over gRPC, plus cluster
// membership (worker registration, heartbeats, peer lookup) through a ClusterMembership.
//
// Connect checks the protocol version and hands the client a key that every later call for that
// client must carry, so one client cannot use, read or free another's slices and buffers. A
// client's Session stream lives as long as the client and carries its runs and releases, in
// order; when it ends, the client is disconnected (its slices and buffers are released); a
// client that never opens one is disconnected after ClientLimits::session_grace.
//
// Two credentials: client calls carry the client token (empty: none required); membership calls
// (RegisterWorker, Heartbeat, GetClusterSpec, Shutdown, Cancel, SetTenant) carry the cluster token,
// which only the controller and its workers hold, so a client cannot pose as a host or stop
// the cluster. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "pw/base/mutex.h"
#include "pw/base/work_queue.h"
#include "pw/rpc/auth.h"
#include "pw/rpc/proto/pathways.grpc.pb.h"
#include "pw/transport/controller_interface.h"

namespace pw::rpc {

// What the controller process adds to the controller: its workers.
class ClusterMembership {
 public:
  virtual ~ClusterMembership() = default;
  virtual absl::StatusOr<::pathways::v1::RegisterWorkerResponse> RegisterWorker(
      const ::pathways::v1::RegisterWorkerRequest& req) = 0;
  virtual absl::Status Heartbeat(HostId host) = 0;
  // Adds membership to a status reply.
  virtual void AddMembers(::pathways::v1::ClusterStatus* out) = 0;
  virtual std::string ClusterSpecJson() = 0;
  virtual void Shutdown() = 0;
  // An admin's cancellation; returns the runs cancelled.
  virtual absl::StatusOr<std::vector<RunId>> Cancel(const ::pathways::v1::CancelRequest& req) = 0;
};

// Limits on clients, checked at Connect (documented in pw/rpc/README.md).
struct ClientLimits {
  // Connected clients at once; one more gets RESOURCE_EXHAUSTED (pw controller --max-clients).
  int64_t max_clients = 1024;
  // A client that has not opened its Session stream this long after Connect is disconnected
  // (what it allocated is released) by ReapSessionless.
  absl::Duration session_grace = absl::Seconds(30);
  // Runs one client may have submitted on its Session and not yet seen finish; while it has
  // this many, the controller reads no more of its Session (its later calls wait: back-pressure).
  int64_t max_runs_in_flight = 4096;
  // Bytes of a session's events the controller holds unwritten (its client does not read its
  // stream, and its runs end meanwhile); past it the session ends with RESOURCE_EXHAUSTED,
  // releasing what the client held, and its later events are dropped. About 1.5 million events:
  // a client that reads never comes near it.
  int64_t max_unread_event_bytes = int64_t{64} << 20;
};

class ControllerService final : public ::pathways::v1::Controller::CallbackService {
 public:
  // Both must outlive the service.
  ControllerService(ControllerInterface* controller, ClusterMembership* membership,
                    std::string client_token, std::string cluster_token,
                    ClientLimits limits = {});
  size_t num_clients() const;
  // Disconnects the clients that connected before `now - session_grace` and have not opened
  // their Session; returns how many. (The controller server calls it from its monitor.)
  int ReapSessionless(absl::Time now);

  // Sessions of clients on this machine go by mail (ClientSession): `own_mailbox` names the
  // controller process's mailbox, whose owner hands the session mail to ReceiveSessionMail. A
  // session takes mail when its stream's metadata names the client's mailbox and it opens here.
  // Call before serving.
  void UseMailbox(std::string own_mailbox);
  // A client's mailed batch, handled in order with its session's others; dropped if no open
  // session has that stub (a stale one's, or a guess).
  void ReceiveSessionMail(::pathways::v1::MailedSession* mail);
  // Handles the mailed batches already taken and stops: call once nothing hands over more
  // (the mailbox stopped delivering), before the controller goes.
  void StopSessionMail();
  // Batches mailed to this service's sessions (the rest came on their streams).
  int64_t session_batches_mailed() const {
    return session_batches_mailed_.load(std::memory_order_relaxed);
  }

#define PW_UNARY(Method, Req, Resp)                                                  \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx,                 \
                                   const ::pathways::v1::Req* req,                   \
                                   ::pathways::v1::Resp* resp) override
  PW_UNARY(Connect, ConnectRequest, ConnectResponse);
  PW_UNARY(SetTenant, TenantSettings, Empty);
  PW_UNARY(Disconnect, ClientRequest, Empty);
  PW_UNARY(AllocateSlice, AllocateSliceRequest, SliceInfo);
  PW_UNARY(ReleaseSlice, ReleaseSliceRequest, Empty);
  PW_UNARY(RegisterFunction, RegisterFunctionRequest, FunctionInfo);
  PW_UNARY(LoadFunction, LoadFunctionRequest, ArraySpecs);
  PW_UNARY(RegisterProgram, RegisterProgramRequest, ProgramId);
  PW_UNARY(ExplainProgram, ProgramRequest, Text);
  PW_UNARY(ReserveBufferIds, ReserveBufferIdsRequest, BufferIdRange);
  PW_UNARY(PutArray, PutArrayRequest, ArrayInfo);
  PW_UNARY(ArrayReady, ArrayRequest, Empty);
  PW_UNARY(BeginPut, BeginPutRequest, DirectPut);
  PW_UNARY(LocateArray, LocateArrayRequest, LocatedArray);
  PW_UNARY(SaveArray, SaveArrayRequest, Empty);
  PW_UNARY(LoadArray, LoadArrayRequest, ArrayInfo);
  PW_UNARY(CommitCheckpoint, CommitCheckpointRequest, CheckpointPath);
  PW_UNARY(ShareArray, ShareArrayRequest, ShareToken);
  PW_UNARY(ImportArray, ShareRequest, ArrayInfo);
  PW_UNARY(RevokeShare, ShareRequest, Empty);
  PW_UNARY(Status, StatusRequest, ClusterStatus);
  PW_UNARY(StartTrace, ClientRequest, Clock);
  PW_UNARY(StopTrace, StopTraceRequest, TraceChunk);
  PW_UNARY(RegisterWorker, RegisterWorkerRequest, RegisterWorkerResponse);
  PW_UNARY(Heartbeat, HeartbeatRequest, HeartbeatResponse);
  PW_UNARY(GetClusterSpec, Empty, Text);
  PW_UNARY(Shutdown, Empty, Empty);
  PW_UNARY(Cancel, CancelRequest, CancelResponse);
#undef PW_UNARY
  grpc::ServerBidiReactor<::pathways::v1::SessionMessageBatch,
                          ::pathways::v1::SessionEventBatch>*
  Session(grpc::CallbackServerContext* ctx) override;

 private:
  class SessionStream;  // controller_session.cc
  struct Outbox;         // A session's state that outlives its stream (controller_session.cc).
  // The call's token and, for `client`, its key.
  absl::Status Authorize(const grpc::CallbackServerContext* ctx, int64_t client) const;
  absl::Status Authorize(const grpc::CallbackServerContext* ctx) const;
  // Authorize, then marks `client`'s Session open (once per client).
  absl::Status OpenSession(const grpc::CallbackServerContext* ctx, int64_t client);
  // A membership call: the cluster token.
  absl::Status AuthorizeMember(const grpc::CallbackServerContext* ctx) const;
  // A session's stream is done: mail naming its stub is dropped from now on.
  void ForgetMail(uint64_t stub);
  // Disconnects `client` once (the Session stream ended or the client asked).
  absl::Status DropClient(ClientId client);
  // Runs `fn` (which returns the call's status) on a thread of the service's own, then finishes
  // the call: for handlers whose controller call waits on RPCs to workers, which must not hold
  // gRPC's callback threads (in one process, the workers' replies may need them).
  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx,
                                    absl::AnyInvocable<absl::Status() &&> fn,
                                    bool membership = false);

  ControllerInterface* const controller_;
  ClusterMembership* const membership_;
  const std::string token_;
  const std::string cluster_token_;
  const ClientLimits limits_;
  mutable pw::Mutex mu_;
  struct Connected {
    std::string key;
    absl::Time since;
    bool session = false;  // Its Session stream has been opened.
  };
  absl::flat_hash_map<ClientId, Connected> keys_ ABSL_GUARDED_BY(mu_);
  int64_t connecting_ ABSL_GUARDED_BY(mu_) = 0;  // Connects past the limit check, not yet in keys_.
  std::string mailbox_;  // UseMailbox's.
  // Sessions that take mail, by stub.
  pw::Mutex mail_mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Outbox>> mail_sessions_ ABSL_GUARDED_BY(mail_mu_);
  std::atomic<int64_t> session_batches_mailed_{0};
  // Mailed session batches are handled here, a session's on one queue (its stub's).
  std::vector<std::unique_ptr<WorkQueue>> session_mail_;
  std::atomic<size_t> next_blocking_{0};
  std::vector<std::unique_ptr<WorkQueue>> blocking_;  // Offload's threads; last: drained first.
};

}  // namespace pw::rpc
