#include "pw/worker/client_time.h"

#include <algorithm>

namespace pw {

void ClientTime::Start(DeviceId device, ClientId client, int64_t now) {
  pw::MutexLock lock(&mu_);
  running_[device] = {client, now};
}

int64_t ClientTime::Stop(DeviceId device, int64_t now) {
  pw::MutexLock lock(&mu_);
  auto it = running_.find(device);
  if (it == running_.end()) return 0;
  const int64_t took = std::max<int64_t>(0, now - it->second.since);
  finished_[it->second.client] += took;
  running_.erase(it);
  return took;
}

std::vector<std::pair<ClientId, int64_t>> ClientTime::Snapshot(int64_t now) const {
  pw::MutexLock lock(&mu_);
  absl::flat_hash_map<ClientId, int64_t> total = finished_;
  for (const auto& [device, r] : running_) total[r.client] += std::max<int64_t>(0, now - r.since);
  std::vector<std::pair<ClientId, int64_t>> out(total.begin(), total.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace pw
