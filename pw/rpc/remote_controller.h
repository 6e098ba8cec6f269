// RemoteController: ControllerInterface over gRPC, what a client uses to reach a controller
// process (`pw up`, `pw controller`). The same client code runs against it as against the
// in-process Controller.
//
// Connect checks the protocol version and opens the client's session stream (ClientSession),
// which carries its runs and releases in order; when this process exits or its connection
// breaks, the controller releases the client's slices and buffers.
// Thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "pw/base/mutex.h"
#include "pw/dataplane/shm_mailbox.h"
#include "pw/rpc/auth.h"
#include "pw/rpc/client_io.h"
#include "pw/rpc/client_session.h"
#include "pw/rpc/proto/pathways.grpc.pb.h"
#include "pw/transport/controller_interface.h"

namespace pw::rpc {

class RemoteController final : public ControllerInterface {
 public:
  // Fails if the controller cannot be reached within `timeout`. Without `options.tls`, TLS comes
  // from $PW_TLS_CA (and $PW_TLS_CERT, $PW_TLS_KEY) when set: every client (CLI, C++, Python)
  // dials here.
  static absl::StatusOr<std::unique_ptr<RemoteController>> Dial(
      const std::string& address, const ChannelOptions& options,
      absl::Duration timeout = absl::Seconds(10));
  // Disconnects every client still connected through this object.
  ~RemoteController() override;

  const std::string& address() const { return core_->address; }
  // The whole status reply, with membership (for `pw status`); `reset_peak_memory` resets the
  // controller's peak resident memory first.
  absl::StatusOr<::pathways::v1::ClusterStatus> FullStatus(bool reset_peak_memory = false);
  absl::Status Shutdown();
  // An admin's cancellation (the channel's token must be the cluster token): run `run`, or
  // every run of `client` in flight. Returns the runs cancelled.
  absl::StatusOr<std::vector<RunId>> CancelRun(RunId run, const std::string& reason);
  absl::StatusOr<std::vector<RunId>> CancelClient(ClientId client, const std::string& reason);

  using ControllerInterface::Connect;
  absl::StatusOr<ClientId> Connect(const std::string& name, const ConnectOptions& options) override;
  // Needs the channel's token to be the cluster token.
  absl::Status SetTenant(const TenantSettings& settings) override;
  absl::Status Disconnect(ClientId client) override;
  absl::StatusOr<SliceInfo> AllocateSlice(ClientId client, const SliceRequest& request) override;
  absl::Status ReleaseSlice(ClientId client, SliceId slice) override;
  // SaveArray's call waits for the workers' writes (no deadline but the client's).
  Future<> SaveArray(ClientId client, BufferId id, const std::string& path) override;
  absl::StatusOr<ArrayInfo> LoadArray(ClientId client, SliceId slice, const Sharding& sharding,
                                      const ArraySpec& spec, const std::string& path) override;
  absl::StatusOr<std::string> CommitCheckpoint(
      ClientId client, const std::string& path,
      const std::vector<std::pair<std::string, std::string>>& files,
      const std::string& final_path) override;
  absl::StatusOr<std::string> ShareArray(ClientId client, BufferId id,
                                         const ShareOptions& options) override;
  absl::StatusOr<ArrayInfo> ImportArray(ClientId client, const std::string& token) override;
  absl::Status RevokeShare(ClientId client, const std::string& token) override;
  absl::StatusOr<FunctionInfo> RegisterFunction(ClientId client, const FunctionDef& def) override;
  absl::StatusOr<std::vector<ArraySpec>> LoadFunction(ClientId client, FunctionId function,
                                                      SliceId slice) override;
  absl::StatusOr<ProgramId> RegisterProgram(ClientId client, const ProgramIr& ir) override;
  absl::StatusOr<std::string> ExplainProgram(ClientId client, ProgramId program) override;
  absl::StatusOr<BufferId> ReserveBufferIds(ClientId client, int64_t count) override;
  Future<RunInfo> Submit(ClientId client, ProgramId program, const std::vector<BufferId>& args,
                         const RunOptions& options) override;
  absl::StatusOr<ArrayInfo> PutArray(ClientId client, SliceId slice, const Sharding& sharding,
                                     HostArray value) override;
  absl::StatusOr<ArrayInfo> PutArrayFrom(ClientId client, SliceId slice, const Sharding& sharding,
                                         const ArraySpec& spec,
                                         absl::Span<const uint8_t> bytes) override;
  // Arrays of kDirectIoMinBytes or more go between this process and the workers (BeginPut,
  // LocateArray), unless the channel uses TLS (the workers' bulk streams take only the
  // cluster's certificates): then, and for smaller ones, through the controller.
  Future<HostArray> FetchArray(ClientId client, BufferId id) override;
  Future<> ArrayReady(ClientId client, BufferId id) override;
  Future<DirectPut> BeginPut(ClientId client, SliceId slice, const Sharding& sharding,
                             const ArraySpec& spec) override;
  Future<LocatedArray> LocateArray(ClientId client, BufferId id, bool inline_only) override;
  absl::Status ReleaseArray(ClientId client, BufferId id) override;
  absl::StatusOr<ClusterStatus> Status() override;
  absl::StatusOr<int64_t> StartTrace(ClientId client) override;
  // Blocks for the answer (a trace is stopped once, at its end).
  Future<trace::Chunk> StopTrace(ClientId client, bool all_tenants) override;

 private:
  absl::StatusOr<std::vector<RunId>> CancelWith(const ::pathways::v1::CancelRequest& req);
  // What asynchronous calls' callbacks use: shared, so a callback that runs after this object is
  // gone (a run finishing after the client exits) still finds it.
  struct Core {
    std::string address;
    ChannelOptions options;
    std::shared_ptr<grpc::Channel> channel;
    uint64_t in_process_generation = 0;  // The server `channel` reaches, in process.
    std::unique_ptr<::pathways::v1::Controller::Stub> stub;
    mutable pw::Mutex mu;
    absl::flat_hash_map<ClientId, std::string> keys ABSL_GUARDED_BY(mu);
    absl::flat_hash_map<ClientId, std::shared_ptr<ClientSession>> sessions ABSL_GUARDED_BY(mu);
    std::shared_ptr<ClientSession> SessionOf(ClientId client) const;
    // Buffers with LocateArray/ArrayReady calls in flight. A ReleaseArray meanwhile is sent once
    // they have finished, so (as in process) a read started before a release completes.
    struct Reads {
      int pending = 0;
      int releases = 0;  // ReleaseArray calls deferred (a buffer may have several handles).
    };
    absl::flat_hash_map<std::pair<ClientId, BufferId>, Reads> reads ABSL_GUARDED_BY(mu);
    // False if a release of the buffer is already deferred (the read must fail as it would in
    // process: the handle is gone).
    bool BeginRead(ClientId client, BufferId id);
    void EndRead(const std::shared_ptr<Core>& self, ClientId client, BufferId id);
    // A context carrying the token and `client`'s key.
    void Prepare(grpc::ClientContext* ctx, ClientId client) const;
    absl::Status Where(const grpc::Status& s) const;
    ClientIo io;  // Large arrays' shards to and from the workers.
    static constexpr size_t kClientMailboxBytes = size_t{1} << 20;
    // Sessions by stub, until closed (a closing session's last events still reach it).
    absl::flat_hash_map<uint64_t, std::weak_ptr<ClientSession>> by_stub ABSL_GUARDED_BY(mu);
    bool mailbox_tried ABSL_GUARDED_BY(mu) = false;
    // This process's mailbox, made at the first Connect, where a controller on this machine
    // mails the sessions' events (ClientSession::Mail); null if it could not be made. Last of
    // the members, so that its thread stops before what it hands events to goes.
    std::unique_ptr<dataplane::ShmMailbox> mailbox ABSL_GUARDED_BY(mu);
    // The mail settings of a new session (none without a mailbox).
    std::optional<ClientSession::Mail> SessionMail();
    // Hands mailed session events to their session.
    void ReceiveMail(absl::string_view message);
  };
  // Whether arrays go beside the controller (no TLS, not in process: in_process.h).
  bool direct_io() const {
    return core_->options.tls == nullptr && !IsInProcess(core_->address);
  }
  // Whether an array of `spec` held in `bytes` bytes goes beside the controller.
  bool SendsDirectly(const ArraySpec& spec, size_t bytes);
  // Puts it so, sending the shards from `bytes` (BeginPut, then ClientIo::Send).
  absl::StatusOr<ArrayInfo> PutDirectly(ClientId client, SliceId slice, const Sharding& sharding,
                                        const ArraySpec& spec, const uint8_t* bytes);
  RemoteController(std::string address, const ChannelOptions& options);

  const std::shared_ptr<Core> core_;
};

}  // namespace pw::rpc
