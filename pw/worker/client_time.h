// ClientTime: each client's device time on one host (HostStatus::client_device_ns), readable in
// the middle of a computation.
//
// Thread-safe. A device thread calls Start before it launches a computation and Stop when it
// completes; Snapshot adds, to each client's finished time, the part of the computations running
// at `now`. So a reader sampling every few milliseconds sees device time as it is spent, not in
// steps of whole computations at their ends (a window of a 0.33 ms computation's eight shards
// would otherwise be off by up to 2.6 device-ms at each end). Each device's account has a lock of
// its own, so device threads never wait for each other; a snapshot takes them one at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"

namespace pw {

class ClientTime {
 public:
  explicit ClientTime(absl::Span<const DeviceId> devices);
  // `device` runs a computation of `client` from `now`. One at a time per device; a device not
  // given at construction is not counted.
  void Start(DeviceId device, ClientId client, int64_t now);
  // It completed at `now`: adds its time to the client's, and returns it (0 without a Start).
  int64_t Stop(DeviceId device, int64_t now);
  // Each client's time at `now`, running computations' part included; sorted by client.
  std::vector<std::pair<ClientId, int64_t>> Snapshot(int64_t now) const;

 private:
  struct Running {
    ClientId client;
    int64_t since;
  };
  struct Account {  // One device's.
    mutable pw::Mutex mu;
    std::optional<Running> running ABSL_GUARDED_BY(mu);
    absl::flat_hash_map<ClientId, int64_t> finished ABSL_GUARDED_BY(mu);
  };
  Account* AccountOf(DeviceId device) const;
  absl::flat_hash_map<DeviceId, std::unique_ptr<Account>> accounts_;  // Fixed at construction.
};

}  // namespace pw
