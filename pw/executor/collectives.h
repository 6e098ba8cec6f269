// Collectives: in-process rendezvous of the shards of one launch, for the native backend.
//
// Thread-safe. Every shard of a collective calls Run() with the same key and device list; the
// last to arrive runs `combine` over all shards' inputs and outputs, then every shard returns.
// Shards block while waiting, as collective kernels occupy accelerators; the island gang
// scheduler's consistent order is what keeps this deadlock-free.
//
// AbortDevice() fails every pending and future rendezvous that includes that device, naming it,
// so the surviving shards of a slice never wait forever on a removed device.
//
// Across processes: with CollectivePeers set, only the shards on this process's devices meet
// here; the last of them sends their inputs to the processes holding the other ranks (Send) and
// waits for theirs (Deliver), then every process combines all inputs itself (so the result is the
// same everywhere) and keeps its own shards' outputs: one message round, the latency-optimal
// algorithm, but O(P^2) bytes for P processes. AllReduce of at least kScatterMinBytes over three
// or more processes instead reduces locally, then reduce-scatters and all-gathers between the
// processes (each process reduces one chunk: 2 (P-1)/P of the buffer sent per process, the
// bandwidth-optimal amount, in two rounds), in pieces of at most kPieceBytes.
// Every wait for another process ends after the timeout (SetTimeout) with DeadlineExceeded,
// naming the collective and what it still waited for.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pw/base/mutex.h"
#include "absl/types/span.h"
#include "pw/base/ids.h"
#include "pw/base/spin_wait.h"

namespace pw {

// Identifies one collective op: the run, the node in it, the op's index inside the node's
// function (a fused function holds many collectives), and which group of the launch's shards
// meets (a collective over one axis of a 2-D mesh meets in several groups at once; 0 when the
// whole launch meets). Identical on every shard of the group.
struct CollectiveKey {
  int64_t run = 0;
  int32_t node = 0;
  int32_t op = 0;
  int32_t group = 0;
  template <typename H>
  friend H AbslHashValue(H h, const CollectiveKey& k) {
    return H::combine(std::move(h), k.run, k.node, k.op, k.group);
  }
  friend bool operator==(const CollectiveKey&, const CollectiveKey&) = default;
};

// How a process's Collectives reaches the processes holding a slice's other devices.
class CollectivePeers {
 public:
  virtual ~CollectivePeers() = default;
  virtual bool IsLocal(DeviceId device) const = 0;
  // Sends `inputs[i]` of local rank `ranks[i]` to every process holding a non-local device of
  // `devices`. May return before delivery; a failed delivery is reported with
  // Collectives::DeliverFailure on this process.
  virtual void Send(const CollectiveKey& key, absl::Span<const DeviceId> devices,
                    std::vector<int> ranks, std::vector<std::string> inputs) = 0;
  // Tells those processes that launch (run, node) failed here.
  virtual void SendFailure(int64_t run, int32_t node, absl::Span<const DeviceId> devices,
                           const absl::Status& reason) = 0;
  // Delivers, on the calling thread, what other processes have sent that is waiting now (a
  // shard waiting in a collective drives delivery instead of waiting for a receiving thread to
  // be scheduled). Returns whether it delivered anything.
  virtual bool Poll() { return false; }
  // The processes holding `devices`, numbered by the first rank each holds: how many, and this
  // one's number.
  struct Processes {
    int count = 1;
    int self = 0;
  };
  virtual Processes ProcessesOf(absl::Span<const DeviceId> devices) const = 0;
  // Sends `bytes` of an AllReduce's `phase` (1: reduce-scatter, 2: all-gather), at `offset` of
  // what process `from` sends in that phase, to process `to` of `devices`. May return before
  // delivery; a failed delivery fails the launch as Send's does.
  virtual void SendPiece(const CollectiveKey& key, absl::Span<const DeviceId> devices, int phase,
                         int to, int from, size_t offset, std::string bytes) = 0;
};

class Collectives {
 public:
  // Runs once, on the last shard to arrive, with inputs[i]/outputs[i] of shard i.
  using Combine = std::function<absl::Status(absl::Span<const void* const> inputs,
                                             absl::Span<void* const> outputs)>;

  // `input_bytes`/`output_bytes`: the sizes of one shard's input and output.
  absl::Status Run(const CollectiveKey& key, absl::Span<const DeviceId> devices, int rank,
                   const void* input, size_t input_bytes, void* output, size_t output_bytes,
                   const Combine& combine);
  // Folds `bytes` of `x` into `acc`, elementwise (bytes is a multiple of the element size).
  using Reduce = std::function<void(void* acc, const void* x, size_t bytes)>;
  // kAuto: by size and process count (see above); kBroadcast: always as Run (the baseline).
  // Every shard of one collective must pass the same.
  enum class Algorithm { kAuto, kBroadcast };
  // An all-reduce of `bytes` per shard (elements of `element_size` bytes): as Run with a combine
  // that reduces every input, by the algorithm that fits (see above).
  absl::Status AllReduce(const CollectiveKey& key, absl::Span<const DeviceId> devices, int rank,
                         const void* input, void* output, size_t bytes, size_t element_size,
                         const Reduce& reduce, Algorithm algorithm = Algorithm::kAuto);
  static constexpr size_t kScatterMinBytes = size_t{256} << 10;
  static constexpr size_t kPieceBytes = size_t{1} << 20;  // Fits a shared-memory mailbox.
  // Set once, before any collective (with SetPeers).
  void SetTimeout(absl::Duration timeout) { timeout_ = timeout; }
  absl::Duration timeout() const { return timeout_; }
  void AbortDevice(DeviceId device, const absl::Status& reason);
  // Collectives run by this process's shards, and their time summed over shards. The kernels
  // that run collectives count each one (Count) and time every kTimedEvery-th of a thread's
  // (Timed: the sum is scaled up): a clock read per collective cost ~3% of a chain of small
  // computations, each with an all-reduce.
  static constexpr int kTimedEvery = 8;
  static bool Timed() {
    thread_local int n = 0;
    return ++n % kTimedEvery == 0;
  }
  void Count(int64_t sampled_ns) {
    count_.fetch_add(1, std::memory_order_relaxed);
    if (sampled_ns > 0) ns_.fetch_add(sampled_ns * kTimedEvery, std::memory_order_relaxed);
  }
  int64_t count() const { return count_.load(std::memory_order_relaxed); }
  int64_t total_ns() const { return ns_.load(std::memory_order_relaxed); }
  // A removed device is back (its host rejoined): later rendezvous including it run again.
  void RestoreDevice(DeviceId device);
  // A shard of launch (run, node) failed without reaching (all of) its collectives: fails that
  // launch's pending and later rendezvous with `reason`, so its other shards do not wait forever.
  // With peers, the processes holding other `devices` of the launch are told too.
  void FailLaunch(int64_t run, int32_t node, const absl::Status& reason,
                  absl::Span<const DeviceId> devices = {});
  // Run `run` was cancelled (its client's timeout, an admin): fails its pending and later
  // rendezvous on this process with `reason` (every process of the run is told by the
  // controller).
  void CancelRun(int64_t run, const absl::Status& reason);
  // The failure FailLaunch recorded for launch (run, node); OK if none.
  absl::Status LaunchFailure(int64_t run, int32_t node) const;
  // Run `run` has ended everywhere: drops its failure records and early inputs, and drops
  // inputs for it that still arrive (the last kForgottenRuns forgotten runs are remembered).
  void ForgetRun(int64_t run);
  static constexpr size_t kForgottenRuns = 4096;
  size_t pending() const;
  // Failure records and early inputs held (what ForgetRun drops).
  size_t records() const;

  // Set once, before any Run, in a process that holds only some devices of a cluster.
  void SetPeers(CollectivePeers* peers) { peers_ = peers; }
  // Another process's input for `rank` of collective `key`.
  void Deliver(const CollectiveKey& key, int rank, std::string input);
  // A piece of another process's AllReduce traffic (CollectivePeers::SendPiece).
  void DeliverPiece(const CollectiveKey& key, int phase, int from, size_t offset,
                    std::string bytes);
  // Another process could not run or deliver its part of launch (run, node).
  void DeliverFailure(int64_t run, int32_t node, const absl::Status& reason) {
    FailLaunch(run, node, reason);
  }

 private:
  std::atomic<int64_t> count_{0}, ns_{0};
  struct Rendezvous {
    Rendezvous(absl::Span<const DeviceId> d, size_t local)
        : devices(d.begin(), d.end()), inputs(d.size()), outputs(d.size()), local(local),
          own_inputs(local == d.size() ? 0 : d.size()),
          remote_inputs(local == d.size() ? 0 : d.size()) {}
    // Claims the right to finish (the last arriver or an abort); exactly one caller wins.
    bool Claim() {
      uint32_t pending = kPending;
      return state.compare_exchange_strong(pending, kFinishing, std::memory_order_acq_rel);
    }
    void Publish(absl::Status s);
    const absl::Status& Wait();

    static constexpr uint32_t kPending = 0, kFinishing = 1, kFinished = 2;
    const absl::InlinedVector<DeviceId, 8> devices;
    absl::InlinedVector<const void*, 8> inputs;  // Slot i is written by rank i before it arrives.
    absl::InlinedVector<void*, 8> outputs;
    std::atomic<size_t> arrived{0};
    std::atomic<uint32_t> state{kPending};
    std::atomic<uint32_t> sleepers{0};  // Threads asleep in Wait().
    absl::Status status;  // Written by the claimant, read after kFinished.
    const size_t local;   // Shards on this process's devices.
    // Across processes: each local shard's copy of its input, made before it arrives, which the
    // combining shard reads (sends, reduces) before it can claim: an abort meanwhile lets the
    // other local shards return, and their own buffers go with them (empty when all are local).
    std::vector<std::string> own_inputs;
    // Other processes' inputs, by rank (empty when every shard is local).
    pw::Mutex remote_mu;
    std::vector<std::string> remote_inputs ABSL_GUARDED_BY(remote_mu);
    // How many of them are in: written under remote_mu (whose waiters it wakes), read without.
    std::atomic<size_t> remote_arrived{0};
    // Set by the combining shard once it has sent the local inputs: from then on, whoever
    // delivers the last remote input combines (so the step does not wait for the combining
    // shard's thread to be scheduled again). The fields before it are written before it is set.
    CollectiveKey key;
    const Combine* combine = nullptr;  // Lives in Run() of the combining shard until published.
    size_t input_bytes = 0, output_bytes = 0;
    std::atomic<bool> sent{false};

    // AllReduce across processes by reduce-scatter + all-gather (`scatter` set at creation).
    struct Scatter {
      int procs = 0, self = 0;
      size_t bytes = 0, element = 0;
      std::string partial;    // This process's local reduction, then its reduced chunk.
      std::string received1;  // Phase 1: each process's copy of our chunk, [procs][chunk].
      std::string gathered;   // Phase 2: the other processes' reduced chunks, in place.
      // Bytes received of each phase: added to under remote_mu after the copy, read without.
      std::atomic<size_t> got1{0}, got2{0};
      // Chunk q of the buffer: [begin, end) in bytes.
      size_t Begin(int q) const { return (bytes / element) * q / procs * element; }
      size_t End(int q) const { return Begin(q + 1); }
    };
    // Set at creation. Its received buffers and counts are written under remote_mu; `partial`
    // only by the combining shard.
    std::unique_ptr<Scatter> scatter;
  };
  // Finds or makes the rendezvous of `key` (applying early inputs); `scatter` as in AllReduce.
  absl::StatusOr<std::shared_ptr<Rendezvous>> Join(const CollectiveKey& key,
                                                   absl::Span<const DeviceId> devices, int rank,
                                                   const CollectivePeers::Processes* scatter,
                                                   size_t bytes, size_t element);
  // Copies a piece into the rendezvous's scatter buffers; false (dropped) if it does not fit.
  static bool StorePiece(Rendezvous& r, int phase, int from, size_t offset,
                         absl::string_view bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.remote_mu);
  // The last local shard of a scattered AllReduce: local reduce, reduce-scatter, all-gather.
  void ScatterAcrossProcesses(const CollectiveKey& key, Rendezvous& r, const Reduce& reduce);
  // Waits, as CombineAcrossProcesses does, until `done` or the rendezvous is finished elsewhere;
  // after the timeout, claims it and publishes DeadlineExceeded naming `what`. Returns whether
  // the caller may go on (done, and not claimed by anyone).
  template <typename F>
  bool AwaitRemote(const CollectiveKey& key, Rendezvous& r, const F& done, const char* what);
  // Runs on the last local shard when other processes hold ranks: sends the local inputs, then,
  // unless an abort or the delivery of the last remote input (Deliver) claimed the rendezvous
  // first, waits for the other processes' inputs, claims it, combines and publishes.
  void CombineAcrossProcesses(const CollectiveKey& key, Rendezvous& r, size_t input_bytes,
                              size_t output_bytes, const Combine& combine);
  // The combine itself, by the claimant, with every input in.
  absl::Status CombineClaimed(const CollectiveKey& key, Rendezvous& r, size_t input_bytes,
                              size_t output_bytes, const Combine& combine)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.remote_mu);
  // Yields the core (as SpinYieldUntil) until `done`, delivering between yields what other
  // processes have sent (peers_->Poll). Returns whether `done` holds.
  template <typename F>
  bool PollUntil(const F& done) {
    return SpinYieldUntil([&] { return done() || (peers_->Poll() && done()); });
  }
  // Fails and forgets every pending rendezvous that `matches`.
  void AbortPending(const absl::Status& reason,
                    absl::FunctionRef<bool(const CollectiveKey&, const Rendezvous&)> matches);
  mutable pw::Mutex mu_;
  absl::flat_hash_map<CollectiveKey, std::shared_ptr<Rendezvous>> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DeviceId, absl::Status> dead_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<int64_t, int32_t>, absl::Status> failed_launches_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, absl::Status> cancelled_runs_ ABSL_GUARDED_BY(mu_);
  // Inputs from other processes that arrived before any local shard of their collective.
  absl::flat_hash_map<CollectiveKey, std::vector<std::pair<int, std::string>>> early_
      ABSL_GUARDED_BY(mu_);
  // AllReduce pieces that arrived before any local shard of their collective.
  struct EarlyPiece {
    int phase, from;
    size_t offset;
    std::string bytes;
  };
  absl::flat_hash_map<CollectiveKey, std::vector<EarlyPiece>> early_pieces_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> forgotten_ ABSL_GUARDED_BY(mu_);
  std::deque<int64_t> forgotten_order_ ABSL_GUARDED_BY(mu_);  // Oldest first.
  CollectivePeers* peers_ = nullptr;
  absl::Duration timeout_ = absl::InfiniteDuration();
};

}  // namespace pw
