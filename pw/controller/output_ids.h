// OutputIds: the buffer ids clients choose for their runs' outputs.
//
// A client names a run's outputs itself, with ids from ranges it reserved
// (ControllerInterface::ReserveBufferIds), so it can use the outputs in its next calls without
// waiting for the controller's answer (pipelined calls). Each id is good for one output, once:
// ids of a lease are claimed in increasing order. When a run with chosen ids fails before it is
// scheduled, its ids are remembered with the reason, so a later call that names one (already
// sent) fails with that reason instead of "not found".
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"

namespace pw {

class OutputIds {
 public:
  // Limits, checked here: ids in one lease, leases a client holds open at once (a lease closes
  // when its last id is claimed), failures remembered per client (the oldest go first).
  static constexpr int64_t kMaxLeaseIds = int64_t{1} << 20;
  static constexpr size_t kMaxOpenLeases = 64;
  static constexpr size_t kMaxFailuresRemembered = 4096;

  // Whether `client` may open one more lease of `count` ids (InvalidArgument or
  // ResourceExhausted saying why not).
  absl::Status CheckLease(ClientId client, int64_t count) const;
  // Records [first, first + count) as `client`'s (CheckLease first).
  absl::Status Lease(ClientId client, BufferId first, int64_t count);
  // Claims `ids` (increasing) for one run of `client`: each must lie in one of its open leases
  // at or past the ids claimed there before. InvalidArgument naming the first that does not
  // (the ones before it stay claimed).
  absl::Status Claim(ClientId client, const std::vector<BufferId>& ids);
  // Claims those of `ids` that Claim would, skipping the rest: the ids of a run that failed
  // before its claim, so its leases still close.
  void Burn(ClientId client, const std::vector<BufferId>& ids);
  // The run that was to make `ids` failed with `why`.
  void Failed(ClientId client, const std::vector<BufferId>& ids, const absl::Status& why);
  // Why `id` was not made, if it is a remembered failure of `client`.
  std::optional<absl::Status> FailureOf(ClientId client, BufferId id) const;
  // Forgets the failure of `id` (its handle was released); whether there was one.
  bool Forget(ClientId client, BufferId id);
  // `client` has gone.
  void Drop(ClientId client);

 private:
  struct Lease_ {
    int64_t next, end;  // Ids [next, end) are still unclaimed.
  };
  struct PerClient {
    std::vector<Lease_> leases;
    absl::flat_hash_map<BufferId, absl::Status> failed;
    std::deque<BufferId> failed_order;  // Oldest first (may name forgotten ones).
  };
  mutable pw::Mutex mu_;
  absl::flat_hash_map<ClientId, PerClient> clients_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw
