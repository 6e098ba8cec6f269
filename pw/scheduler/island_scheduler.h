// IslandScheduler: the gang scheduler of one island (paper §4.4).
//
// Thread-safe. Every computation on the island's devices, from every program and every client,
// is dispatched one request at a time, in the order the scheduler's policy picks: by the
// scheduler thread, or, when a request reaches an idle island, by the thread that submits it
// (the policy would pick it at once; this saves a hand-off per request). Since each worker
// enqueues the messages it receives in arrival order, every device of the island sees
// computations in one consistent order, so SPMD computations with collectives cannot deadlock
// however clients interleave.
//
// The scheduler holds the order and feeds the devices as work completes: it keeps at most a
// window of estimated device time in flight on the island (Options::window per device), so the
// policy decides what runs next at the scale of milliseconds, while work already in flight still
// hides the host-side latency of what follows (parallel asynchronous dispatch). A request's
// estimate is its program's measured device time (DispatchAck::done), averaged over its recent
// runs; a program's first run counts as Options::first_estimate per device.
//
// The window is kept on top of the island's control round trip: a device that finishes its work
// gets more only after its host's answer has reached the scheduler and the next dispatch has
// reached the host. So the scheduler measures that round trip (from a parallel request's
// dispatch to the instant its last host enqueued it, as the hosts' answers report it: a moving
// average, each sample at most kMaxRoundTrip) and lets `window + 2 x round trip` per device be
// in flight (once for finished work whose answer is on its way, once for the refill). Where
// hosts answer in microseconds this is the window; where answers take milliseconds (a loaded
// machine) the devices still stay fed (measured in pw/scheduler/README.md).
//
// Parallel dispatch sends each host one message holding all its nodes of the request and moves
// on. Sequential dispatch sends node by node, each once the previous is enqueued on all of its
// hosts; the dispatching thread does not wait for it (the acks continue it), but no other
// request of the island is dispatched until its last node is out, which keeps the island's one
// order.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "pw/base/mutex.h"
#include "pw/scheduler/scheduling_policy.h"
#include "pw/transport/worker_interface.h"

namespace pw {

class IslandScheduler {
 public:
  // The worker of `host` for work submitted at membership epoch `membership`
  // (IslandWork::membership): null if the host has none, or has failed since (its worker now, if
  // any, is a new one holding none of what the work reads).
  using WorkerLookup = std::function<WorkerInterface*(HostId host, uint64_t membership)>;
  struct Options {
    int devices = 1;  // The island's.
    // Estimated device time in flight, per device of the island: the next request is
    // dispatched while less than this is in flight (always when nothing is).
    absl::Duration window = absl::Milliseconds(2);
    int max_in_flight = 256;  // Requests, whatever their estimates.
    absl::Duration first_estimate = absl::Milliseconds(1);  // Per device of the request.
    std::function<absl::Time()> now = [] { return absl::Now(); };  // Tenants' recent usage.
  };
  // The most one round-trip sample counts as (a stall must not open the window for long).
  static constexpr absl::Duration kMaxRoundTrip = absl::Milliseconds(50);
  // What one tenant has on this island.
  struct TenantLoad {
    std::shared_ptr<const Tenant> tenant;
    int64_t queued = 0;
    int64_t device_ns_last_second = 0;  // Device time of its requests that finished in it.
    int64_t device_ns_total = 0;        // Since the scheduler first saw the tenant.
  };

  IslandScheduler(IslandId island, std::unique_ptr<SchedulingPolicy> policy, WorkerLookup workers,
                  Options options);
  // Dispatches every request already submitted, waits for all to finish (their completions use
  // the scheduler), then stops.
  ~IslandScheduler();
  IslandScheduler(const IslandScheduler&) = delete;
  IslandScheduler& operator=(const IslandScheduler&) = delete;

  // A request that its submitter dispatches (Submit's `deferred`): Run dispatches it, on the
  // calling thread; the destructor does, if Run was not called. Until then it holds the
  // island's dispatch token (nothing else is dispatched on the island), so run it as soon as
  // the caller's own locks are released. Not thread-safe.
  class InlineDispatch {
   public:
    InlineDispatch() = default;
    InlineDispatch(InlineDispatch&&) = default;
    InlineDispatch& operator=(InlineDispatch&&) = delete;
    ~InlineDispatch() { Run(); }
    void Run();

   private:
    friend class IslandScheduler;
    IslandScheduler* scheduler_ = nullptr;
    std::unique_ptr<ScheduleRequest> request_;
  };

  // `done` is the request's device time on this island (DispatchAck::done). A request that
  // reaches an idle island (nothing queued or being dispatched, no sequential request's nodes
  // still going out, room in the window) is dispatched by the calling thread, which saves a
  // hand-off to the scheduler thread: before Submit returns, or, given `deferred`, when the
  // caller runs it. Either way WorkerLookup and WorkerInterface::Dispatch run on the caller's
  // thread, so it must not hold locks they take while it dispatches.
  DispatchAck Submit(IslandWork work, InlineDispatch* deferred = nullptr);

  IslandId island() const { return island_; }
  std::string policy() const;
  size_t queue_depth() const;
  int64_t dispatched() const;
  int in_flight() const;
  // The control round trip the window is kept on top of (zero until measured).
  absl::Duration round_trip() const;
  // Whether the scheduler thread waits, having found nothing it may dispatch (queue empty,
  // window full, or a sequential dispatch under way), and nothing has changed since it looked:
  // what was submitted or finished before this call has been acted on. Tests wait for this.
  bool settled() const;
  std::vector<TenantLoad> TenantLoads() const;

 private:
  struct Finished {
    absl::Time at;
    int64_t tenant;
    int64_t device_ns;
  };
  void Loop();
  // The next request to dispatch, popped, once one may go; null once stopping and drained.
  std::unique_ptr<ScheduleRequest> Next();
  // Whether the window has room for one more request.
  bool MayDispatch() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the policy's next request may be popped now: one is queued, the window has room, and
  // no other dispatch is under way (nor a sequential request's nodes still going out).
  bool MayPopLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pops it and takes the dispatch token (`dispatching_`) for the caller.
  std::unique_ptr<ScheduleRequest> PopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Dispatches a request popped by PopLocked, then gives the dispatch token back.
  void DispatchAndRelease(std::unique_ptr<ScheduleRequest> r) ABSL_LOCKS_EXCLUDED(mu_);
  void Dispatch(std::unique_ptr<ScheduleRequest> r);
  // Sends the sequential request's nodes from `next_node` on, each once the previous is enqueued.
  struct Sequential;
  void ContinueSequential(std::shared_ptr<Sequential> seq);
  // Accounts for a dispatched request that finished (`ran`: its device time), then sets its
  // done.
  // `round_trip`: from its dispatch to its hosts' enqueue, where known (else zero).
  void OnFinished(ScheduleRequest& r, const absl::StatusOr<int64_t>& ran,
                  absl::Duration round_trip);
  int64_t EstimateLocked(const IslandWork& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropOldFinishedLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const IslandId island_;
  const WorkerLookup workers_;
  const Options options_;
  mutable pw::Mutex mu_;
  std::unique_ptr<SchedulingPolicy> policy_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // Bumped by whatever may let one more go.
  // The generation the scheduler thread waits for a change of, while it waits.
  std::optional<uint64_t> waiting_on_ ABSL_GUARDED_BY(mu_);
  int64_t dispatched_ ABSL_GUARDED_BY(mu_) = 0;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_ns_ ABSL_GUARDED_BY(mu_) = 0;  // Their estimates.
  int64_t round_trip_ns_ ABSL_GUARDED_BY(mu_) = 0;  // A moving average.
  bool sequential_busy_ ABSL_GUARDED_BY(mu_) = false;
  // The dispatch token: a thread (the scheduler's, or a submitting one) is dispatching a
  // request; no other dispatches until it is done, so the hosts receive one order.
  bool dispatching_ ABSL_GUARDED_BY(mu_) = false;
  // Measured device time per program (its first host program's id), a moving average.
  absl::flat_hash_map<uint64_t, int64_t> estimates_ ABSL_GUARDED_BY(mu_);
  // Requests finished in the last second, oldest first, and every tenant seen in it.
  std::deque<Finished> finished_ ABSL_GUARDED_BY(mu_);
  // Every tenant with work here, and its device time; one nothing else holds any more (no
  // client, no request) is dropped.
  struct TenantTotal {
    std::shared_ptr<const Tenant> tenant;
    int64_t device_ns = 0;
  };
  absl::flat_hash_map<int64_t, TenantTotal> tenants_ ABSL_GUARDED_BY(mu_);
  void DropGoneTenantsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Dispatches so far, read and written only by the dispatch token's holder (`dispatching_`
  // hands it over under mu_): its trace spans' gang position.
  int64_t dispatched_seq_ = 0;
  std::thread thread_;
};

}  // namespace pw
