// RunManager: the controller's runs in flight (issue 24's "controller as parts"): each run's
// client, program and end (the future its client waits on), its timeout, and the cancellations
// told to the workers (so that workers forget a cancelled or failed run's records once it ends).
//
// A run's end is set once: by Finish, or earlier by a cancellation (Cancel, CancelClient with
// end_them, its timeout). Finish is called exactly once per started run, whatever happened.
//
// Thread-safe. cancel_mu_ (held while telling workers to cancel or forget, so a run's ForgetRuns
// never overtakes its CancelRuns) is taken before mu_; neither is held while a run's end is set.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"
#include "pw/base/timer.h"
#include "pw/transport/controller_interface.h"
#include "pw/transport/worker_interface.h"

namespace pw {

class RunManager {
 public:
  // `workers`: those to tell of cancellations. `on_done` (may be empty): each run's time from
  // Start to Finish and its status, before its client sees it end.
  using Workers = std::function<std::vector<WorkerInterface*>()>;
  using OnDone = std::function<void(absl::Duration, const absl::Status&)>;
  RunManager(Workers workers, OnDone on_done);
  ~RunManager();  // Waits until no run is in flight.
  RunManager(const RunManager&) = delete;
  RunManager& operator=(const RunManager&) = delete;

  struct Started {
    RunId run;
    Future<> done;  // Its end.
  };
  // A new run of `client`'s program `program`; past `timeout` (when > 0) it is cancelled with
  // DeadlineExceeded naming the run, the program and the timeout.
  Started Start(ClientId client, const std::string& program, absl::Duration timeout);
  // `run` ended with `s`: its end is set (unless a cancellation set it first), and the workers
  // forget it if it was cancelled or failed.
  void Finish(RunId run, const absl::Status& s);

  // Cancels `run` on the workers and ends it with `why`; NotFound if it is not in flight.
  absl::Status Cancel(RunId run, const absl::Status& why);
  // Cancels `client`'s runs in flight on the workers (sorted); with `end_them` their ends are set
  // to `why`, else they end when the workers fail them.
  std::vector<RunId> CancelClient(ClientId client, const absl::Status& why, bool end_them);

  // Blocks until no run is in flight.
  void WaitIdle();

  struct Counts {
    int64_t in_flight = 0;  // Started, not yet through Finish.
    int64_t completed = 0;  // Through Finish.
    std::vector<ClusterStatus::Running> running;  // Oldest first, at most `max_listed`.
  };
  Counts Snapshot(size_t max_listed) const;
  size_t size() const;  // Runs whose owner is still recorded.

 private:
  // What the run's client waits on: set once.
  struct End {
    void Set(const absl::Status& s);
    pw::Mutex mu;
    std::optional<Promise<>> promise ABSL_GUARDED_BY(mu) = Promise<>();
  };
  struct Owner {
    ClientId client;
    std::string program;
    std::shared_ptr<End> end;
    std::optional<Timer::Id> timeout;
    absl::Time started;
  };
  void CancelOnWorkers(const std::vector<RunId>& runs, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cancel_mu_);

  const Workers workers_;
  const OnDone on_done_;
  pw::Mutex cancel_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::flat_hash_set<RunId> cancelled_ ABSL_GUARDED_BY(cancel_mu_);  // Still in flight.
  mutable pw::Mutex mu_;
  int64_t next_run_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<RunId, Owner> owners_ ABSL_GUARDED_BY(mu_);
  Timer timeouts_;  // Last, so stopped first.
};

}  // namespace pw
