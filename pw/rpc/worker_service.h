// WorkerService: serves one host's WorkerInterface (a Worker) over gRPC.
//
// Commands (dispatches, puts, deletes) arrive on one stream per controller connection and are
// applied in arrival order; their progress (enqueued, done) goes back on the same stream. A
// stream whose metadata asks for it (a controller on this machine: RemoteWorker::MailCommands)
// also takes its commands by mail (ApplyMailedCommands) and applies them all in seq order
// whichever way each came; its events go to the controller's mailbox where they fit. Host
// programs are cached by id, so a program's body crosses the wire once per worker. FetchShard
// streams a shard once it is ready (the data plane's read side): in chunks, through shared
// memory (a reader on this machine), or, for a large shard and a reader on another machine, as
// a ticket to pull its bytes from the bulk stream (bulk_server.h); Collective delivers a
// peer's inputs to this process's Collectives; Mail takes what a peer on this machine could not
// put in this process's mailbox (PeerMail). Every call needs the cluster token: only the
// controller and peer workers may call a worker.
//
// Thread-safe: gRPC calls the handlers on its own threads; all state is under mu_.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "pw/base/mutex.h"
#include "pw/dataplane/bulk_server.h"
#include "pw/dataplane/shm_arena.h"
#include "pw/executor/collectives.h"
#include "pw/rpc/auth.h"
#include "pw/rpc/proto/pathways.grpc.pb.h"
#include "pw/trace/trace.h"
#include "pw/transport/worker_interface.h"

namespace pw::rpc {

class WorkerService final : public ::pathways::v1::Worker::CallbackService {
 public:
  // `worker` must outlive the service (and the server running it). `receive_collective` takes
  // each contribution that arrives by RPC (the same receiver as the shared-memory mailbox's).
  using CollectiveReceiver =
      std::function<absl::Status(const ::pathways::v1::CollectiveContribution&)>;
  // `bulk` (may be null: shards always go in chunks) serves large shards to readers on other
  // machines; it must outlive the service's calls.
  // `put_later` stores a shard whose bytes a client uploads (Worker::PutShardLater); with
  // `bulk`, it lets clients send and read shards on the bulk stream (client_upload and
  // client_fetch commands).
  using PutLater =
      std::function<Future<>(BufferId, DeviceId, const ArraySpec&, Future<DeviceBufferRef>)>;
  // `on_hosts` takes each host table the controller pushes (the process's peer directory).
  using HostsReceiver = std::function<void(const ::pathways::v1::HostTable&)>;
  // Where a fetch's answer goes: on the stream (stub 0), or as MailedEvents to stub `stub` of
  // host `host` through its mailbox `mailbox` (ShardRequest.reply_*, MailedFetches).
  struct ReplyTo {
    HostId host;
    uint64_t stub = 0;
    std::string mailbox;
  };
  // `mail` sends the answers to a peer's fetches that asked for them by mailbox; false when it
  // cannot (the mailbox is gone, or full): they go on the stream then. Called while the stream
  // is served (the service alive).
  using Mailer = std::function<bool(const ReplyTo& reply,
                                    const std::vector<::pathways::v1::CommandEvent>& events)>;
  // The most commands or events one PeerMail by the Mail RPC, or one MailedFetches, carries.
  static constexpr int kMaxMailItems = 1024;
  // `on_mail` takes what peers send by the Mail RPC (mail that did not fit in a mailbox).
  using MailReceiver = std::function<void(const ::pathways::v1::PeerMail&)>;
  WorkerService(WorkerInterface* worker, std::string cluster_token,
                CollectiveReceiver receive_collective, dataplane::BulkServer* bulk = nullptr,
                HostsReceiver on_hosts = nullptr, PutLater put_later = nullptr,
                Mailer mail = nullptr, MailReceiver on_mail = nullptr);
  // A peer's fetches that came by mail (a reader on this machine): each answered as on the
  // command stream, those of one buffer together once ready, handed to `answer` (on whichever
  // thread makes the last shard ready; it must not use what may be gone by then). At most
  // kMaxMailItems commands, and only fetches: the others are answered with an error.
  void AnswerMailedFetches(
      const ::pathways::v1::MailedFetches& mail,
      std::function<void(const ReplyTo&, std::vector<::pathways::v1::CommandEvent>)> answer);
  // The controller's commands that came by mail (MailedCommands, from a controller on this
  // machine): applied with those of the stream naming their stub, in seq order; dropped if that
  // stream is over.
  void ApplyMailedCommands(::pathways::v1::MailedCommands& mail);
  // Answers that went through readers' mailboxes (HostStatus::events_mailed).
  void CountMailedEvents(int64_t n) { events_mailed_.fetch_add(n, std::memory_order_relaxed); }
  // Hands a peer's contribution (from RPC or shared memory) to `collectives`.
  static absl::Status Deliver(Collectives* collectives,
                              const ::pathways::v1::CollectiveContribution& c);

  grpc::ServerUnaryReactor* LoadFunction(grpc::CallbackServerContext* ctx,
                                         const ::pathways::v1::WorkerLoadFunctionRequest* req,
                                         ::pathways::v1::Empty* resp) override;
  grpc::ServerBidiReactor<::pathways::v1::CommandBatch, ::pathways::v1::CommandEventBatch>*
  Commands(grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<::pathways::v1::ShardChunk>* FetchShard(
      grpc::CallbackServerContext* ctx, const ::pathways::v1::ShardRequest* req) override;
  grpc::ServerUnaryReactor* RemoveDevice(grpc::CallbackServerContext* ctx,
                                         const ::pathways::v1::RemoveDeviceRequest* req,
                                         ::pathways::v1::Empty* resp) override;
  grpc::ServerUnaryReactor* RestoreDevice(grpc::CallbackServerContext* ctx,
                                          const ::pathways::v1::RemoveDeviceRequest* req,
                                          ::pathways::v1::Empty* resp) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const ::pathways::v1::Empty* req,
                                   ::pathways::v1::HostStatus* resp) override;
  grpc::ServerUnaryReactor* Collective(grpc::CallbackServerContext* ctx,
                                       const ::pathways::v1::CollectiveContribution* req,
                                       ::pathways::v1::Empty* resp) override;
  grpc::ServerUnaryReactor* Mail(grpc::CallbackServerContext* ctx,
                                 const ::pathways::v1::PeerMail* req,
                                 ::pathways::v1::Empty* resp) override;
  // The controller's trace of the cluster: starts this process's recorder, or stops it and
  // answers its events on the controller's clock (controller_clock()).
  grpc::ServerUnaryReactor* Trace(grpc::CallbackServerContext* ctx,
                                  const ::pathways::v1::WorkerTraceRequest* req,
                                  ::pathways::v1::TraceChunk* resp) override;
  // The controller's clock minus this process's: sampled at registration and each heartbeat
  // (pw/server).
  trace::ClockOffset& controller_clock() { return controller_clock_; }
  // Ends every command stream it serves (the controller's and peers'), and each opened from now
  // on, with `why`: events not yet written are dropped. A stopping worker calls it before its
  // server shuts down, which otherwise waits out its grace for streams that their callers keep
  // open.
  void EndStreams(const absl::Status& why);

  // Chunk size of FetchShard streams, for readers that do not take the bulk stream: chunks that
  // stay in cache while protobuf and gRPC copy them (on 64 MiB transfers, 1 MiB and 512 KiB
  // chunks were the fastest, at 0.75-0.95 of raw TCP; 4 MiB ~0.7, 16 MiB ~0.5, 256 KiB ~0.4).
  static constexpr size_t kChunkBytes = size_t{1} << 20;
  // Shards larger than this go to readers on other machines on the bulk stream (when they ask)
  // and to readers on this machine through shared memory; smaller ones in the stream's first
  // chunk, which saves the bulk read's round trip, or the segment's (64 KiB or less: a
  // shared-memory fetch was no faster than a chunk, 180-220 us each, `pw bench transfer`; and
  // with many in flight each took a fresh segment, its mapping and faults on both sides).
  static constexpr size_t kOneChunkMaxBytes = size_t{64} << 10;
  // How long a client's transfer waits for the client (ClientTransferRequest::timeout_ms; 0:
  // the default, and a second per 50 MB of the shard), at most.
  static constexpr absl::Duration kDefaultClientTransferTimeout = absl::Seconds(60);
  static constexpr absl::Duration kMaxClientTransferTimeout = absl::Minutes(10);

 private:
  class CommandStream;
  struct CommandSink;
  class ShardStream;
  // Drops cached host programs (their client disconnected; RemoteWorker::Unload).
  void ForgetPrograms(const std::vector<uint64_t>& ids);
  // The cached host program `id`, storing `body` first if given.
  absl::StatusOr<std::shared_ptr<const HostProgram>> Program(
      uint64_t id, const ::pathways::v1::HostProgram* body);

  WorkerInterface* const worker_;
  const std::string token_;
  const CollectiveReceiver receive_collective_;
  dataplane::BulkServer* const bulk_;
  const HostsReceiver on_hosts_;
  const PutLater put_later_;
  const Mailer mail_;
  const MailReceiver on_mail_;
  // Readers' arena segments that shard streams write into.
  dataplane::ShmWriterCache arena_writer_;
  trace::ClockOffset controller_clock_;
  pw::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<const HostProgram>> programs_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> traces_ ABSL_GUARDED_BY(mu_);  // The controller's traces' starts, oldest first.
  // The command streams being served, and why they end (EndStreams: set once).
  absl::flat_hash_set<std::shared_ptr<CommandSink>> command_sinks_ ABSL_GUARDED_BY(mu_);
  // Those that take mail, by stub (CommandSink::mail_stub).
  absl::flat_hash_map<uint64_t, std::shared_ptr<CommandSink>> mail_sinks_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> streams_ended_ ABSL_GUARDED_BY(mu_);
  // Read from command streams (HostStatus::commands_received, command_messages_received).
  std::atomic<int64_t> commands_received_{0};
  std::atomic<int64_t> command_messages_received_{0};
  std::atomic<int64_t> events_sent_{0};
  std::atomic<int64_t> event_messages_sent_{0};
  std::atomic<int64_t> events_mailed_{0};
};

}  // namespace pw::rpc
