// RemoteWorker: WorkerInterface over gRPC, for the controller (commands) and for peer workers
// (the data plane's FetchShard, collectives).
//
// Commands (Dispatch, PutShard, FetchShard, DeleteBuffers, Unload, CancelRuns, ForgetRuns) go on
// one stream, opened on first use, so the worker applies them in call order; each host program's
// body is sent once per stream. A fetch's shard comes back on that stream when it is small (no
// call per shard); a larger one then comes on a FetchShard stream of its own (shared memory on
// this machine, else the bulk stream). When the stream breaks (the worker died) or Fail() is
// called (missed heartbeats), every outstanding and later command fails with Unavailable naming
// the host and why. A controller's stub of a worker on its machine mails the commands instead
// (MailCommands). Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "pw/base/mutex.h"
#include "pw/dataplane/peer_channel.h"
#include "pw/rpc/auth.h"
#include "pw/rpc/proto/pathways.grpc.pb.h"
#include "pw/trace/trace.h"
#include "pw/transport/worker_interface.h"

namespace pw::rpc {

class RemoteWorker final : public WorkerInterface {
 public:
  // How long a command that can wait (DeleteBuffers, ForgetRuns) waits for another to go with
  // before it goes alone: releases of a busy host cost no message of their own.
  static constexpr absl::Duration kLazyFlush = absl::Milliseconds(2);

  // `same_machine`: the worker runs on this machine, so shards are fetched through shared memory.
  RemoteWorker(HostId host, std::string address, const ChannelOptions& options,
               bool same_machine = false, absl::Duration lazy_flush = kLazyFlush);
  // Closes the command stream; outstanding commands fail.
  ~RemoteWorker() override;

  HostId host() const override { return host_; }
  const std::string& address() const { return address_; }
  Future<> LoadFunction(FunctionId id, const FunctionDef& def) override;
  DispatchAck Dispatch(HostWork work) override;
  Future<> PutShard(BufferId id, DeviceId device, HostArray shard) override;
  Future<DeviceBufferRef> FetchShard(BufferId id, DeviceId device) override;
  // One message asks for them all; the worker answers them in one (WorkerService).
  std::vector<Future<DeviceBufferRef>> FetchShards(BufferId id,
                                                   const std::vector<DeviceId>& devices) override;
  bool remote() const override { return true; }
  // The worker's bulk stream serves the client, under a new key (NewSecret) per transfer.
  UploadAck ExpectUpload(BufferId id, DeviceId device, const ArraySpec& spec) override;
  Future<ShardTransfer> OfferShard(BufferId id, DeviceId device) override;
  Future<> SaveShard(BufferId id, DeviceId device, const ShardFile& file) override;
  Future<> LoadShard(BufferId id, DeviceId device, const ArraySpec& spec,
                     const ShardFile& file) override;
  void DeleteBuffers(const std::vector<BufferId>& ids) override;
  void Unload(const std::vector<FunctionId>& functions,
              const std::vector<uint64_t>& host_programs) override;
  void CancelRuns(const std::vector<RunId>& runs, const absl::Status& reason) override;
  void ForgetRuns(const std::vector<RunId>& runs) override;
  // These calls wait at most 5 s (LoadFunction: the control deadline) for their answers.
  Future<> RemoveDevice(DeviceId device, const absl::Status& reason) override;
  Future<> RestoreDevice(DeviceId device) override;
  // Asks the worker (3 s at most); an error naming the host if it cannot be reached.
  Future<HostStatus> Status() const override;
  // The cluster's membership (not a WorkerInterface call: the process's peer directory),
  // ordered on the command stream before any later command.
  void SetHosts(const ::pathways::v1::HostTable& table);
  // The worker process's trace recorder (not a WorkerInterface call: it is the process's):
  // starts it (an empty chunk back), or stops it and returns its events on the controller's
  // clock. Waits at most 10 s.
  absl::StatusOr<trace::Chunk> Trace(bool start);

  // Sends a collective contribution (fire and forget); `on_error` runs if it cannot be delivered.
  void SendCollective(::pathways::v1::CollectiveContribution c,
                      std::function<void(const absl::Status&)> on_error);
  // Sends mail by RPC (the worker's mailbox was full); `done` runs with the call's outcome.
  void SendMail(::pathways::v1::PeerMail mail, std::function<void(const absl::Status&)> done);
  // Fails every outstanding and later command with Unavailable: "<host> at <address>: <reason>".
  void Fail(const std::string& reason);
  // Why commands fail now ("" while the worker is reachable).
  std::string failure() const;
  // Opens the command stream now (else the first command opens it), so that a worker process
  // that dies while idle is noticed at once, by the stream breaking.
  void OpenCommandStream();

  // Fetches ask the worker (on this machine) to answer them through the mailbox of host `self`,
  // this process, as MailedEvents naming mail_id(); the process hands those to OnMailedEvents.
  // With `send_to_worker` (the worker's mailbox: false if the mail did not fit), the fetches
  // themselves go by mail too (MailedFetches), else on the command stream. The stream is
  // opened either way: its end fails what is pending. Call before the stub's first use.
  // `self_mailbox` is this process's mailbox's name.
  void UseMailboxes(HostId self, std::string self_mailbox,
                    std::function<bool(const ::pathways::v1::PeerMail&)> send_to_worker);
  // The controller's stub of a worker on its machine: once the worker says it takes them (its
  // stream's initial metadata), commands go by mail (MailedCommands through `send_to_worker`,
  // false if the mail did not fit: then that batch goes on the stream) and their events come
  // back through `self_mailbox`, this process's mailbox, as MailedEvents naming mail_id(); the
  // process hands those to OnMailedEvents. The worker applies them in seq order. Call before the
  // stub's first use.
  void MailCommands(std::string self_mailbox,
                    std::function<bool(const ::pathways::v1::PeerMail&)> send_to_worker);
  // Commands that went by mail (MailCommands).
  int64_t commands_mailed() const { return commands_mailed_.load(std::memory_order_relaxed); }
  // This stub among the process's stubs (random, never 0).
  uint64_t mail_id() const { return mail_id_; }
  // Events the worker mailed (answers to fetches), as if they came on the stream.
  void OnMailedEvents(const ::pathways::v1::MailedEvents& mail);

  // Fetches in flight from this worker: Fail() cancels them, as a stalled worker never answers.
  // Calls in flight to the worker outside the command stream (fetches, unary calls): cancelled
  // and waited for when this goes.
  struct Fetches {
    pw::Mutex mu;
    absl::flat_hash_set<grpc::ClientContext*> calls ABSL_GUARDED_BY(mu);
    std::string failed ABSL_GUARDED_BY(mu);  // Non-empty once Fail() ran: later fetches end too.
  };

 private:
  class Stream;
  struct Pending {
    Promise<absl::Time> enqueued;  // A dispatch's.
    absl::Time sent;               // A dispatch's: when it was written.
    Promise<> done;      // Invalid for dispatches, which have `ran`.
    std::optional<Promise<int64_t>> ran;  // A dispatch's end: its device time.
    // A fetch's: its shard, and what it reads (for a shard too large for an event).
    std::optional<Promise<DeviceBufferRef>> fetched;
    // A client transfer's: where the client goes (set by the event with the bulk port).
    std::optional<Promise<ShardTransfer>> transfer;
    std::string key;
    BufferId buffer;
    DeviceId device;
  };
  // Fails whichever of `p`'s promises are still unset.
  static void FailPending(Pending& p, const absl::Status& error);
  // A fetch's answer: the shard in `e`, or (too large for an event) a FetchShard stream.
  void Fetched(Pending p, const ::pathways::v1::CommandEvent& e, const absl::Status& s);
  // The FetchShard stream for a shard too large for the command stream.
  void FetchLarge(BufferId id, DeviceId device, Promise<DeviceBufferRef> p);
  // "fetching <id> on <device> from <host> at <address>", for a fetch's errors.
  std::string FetchWhere(BufferId id, DeviceId device) const;
  // A client transfer's answer from event `e` (ENQUEUED for an upload, DONE for a fetch).
  void Transferred(Pending& p, const ::pathways::v1::CommandEvent& e, const absl::Status& s) const;
  // Sends `c` (with seq set) on the stream, opening it if needed; `p` is kept until DONE.
  // Writes `c` on the command stream (a dispatch of `program`: with its body the first time).
  void Send(::pathways::v1::Command c, Pending p, const HostProgram* program = nullptr);
  // Sends `commands` in one write (each kept with its Pending until answered).
  void SendAll(std::vector<std::pair<::pathways::v1::Command, Pending>> commands);
  // Sends fetches `commands` in one mail to the worker's mailbox (on the stream if it is full),
  // asking for the answers in host `reply_host`'s.
  void MailAll(std::vector<std::pair<::pathways::v1::Command, Pending>> commands,
               int64_t reply_host);
  void OpenStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A command no event answers (deletes, cancellations): dropped once the worker has failed.
  // A lazy one (deletes, forgotten runs) goes in the next write, at the latest after lazy_flush_.
  void SendUnacknowledged(::pathways::v1::Command c, bool lazy = false);
  void OnEvent(const ::pathways::v1::CommandEvent& e);
  void OnStreamEnd(Stream* stream, const absl::Status& s);
  absl::Status Where(const absl::Status& s) const;
  std::string Where() const;  // "host:N at ADDRESS".

  const HostId host_;
  const std::string address_;
  const ChannelOptions options_;
  const absl::Duration lazy_flush_;
  // Large shards from this worker: shared memory on this machine, else its bulk stream.
  const std::shared_ptr<dataplane::PeerChannel> data_plane_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<::pathways::v1::Worker::Stub> stub_;

  mutable pw::Mutex mu_;
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string failed_ ABSL_GUARDED_BY(mu_);  // Non-empty: why every command now fails.
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> programs_sent_ ABSL_GUARDED_BY(mu_);  // On stream_.
  const std::shared_ptr<Fetches> fetches_ = std::make_shared<Fetches>();
  const uint64_t mail_id_;
  // UseMailboxes': this process's host (-1: answers on the stream), and the worker's mailbox.
  std::atomic<int64_t> reply_host_{-1};
  std::function<bool(const ::pathways::v1::PeerMail&)> send_to_worker_;
  std::string self_mailbox_;
  bool mail_commands_ = false;  // MailCommands: set before the stream opens.
  std::atomic<int64_t> commands_mailed_{0};
};

}  // namespace pw::rpc
