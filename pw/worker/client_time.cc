#include "pw/worker/client_time.h"

#include <algorithm>

namespace pw {

ClientTime::ClientTime(absl::Span<const DeviceId> devices) {
  for (DeviceId d : devices) accounts_.emplace(d, std::make_unique<Account>());
}

ClientTime::Account* ClientTime::AccountOf(DeviceId device) const {
  auto it = accounts_.find(device);
  return it == accounts_.end() ? nullptr : it->second.get();
}

void ClientTime::Start(DeviceId device, ClientId client, int64_t now) {
  Account* a = AccountOf(device);
  if (a == nullptr) return;
  pw::MutexLock lock(&a->mu);
  a->running = Running{client, now};
}

int64_t ClientTime::Stop(DeviceId device, int64_t now) {
  Account* a = AccountOf(device);
  if (a == nullptr) return 0;
  pw::MutexLock lock(&a->mu);
  if (!a->running.has_value()) return 0;
  const int64_t took = std::max<int64_t>(0, now - a->running->since);
  a->finished[a->running->client] += took;
  a->running.reset();
  return took;
}

std::vector<std::pair<ClientId, int64_t>> ClientTime::Snapshot(int64_t now) const {
  absl::flat_hash_map<ClientId, int64_t> total;
  for (const auto& [device, a] : accounts_) {
    pw::MutexLock lock(&a->mu);
    for (const auto& [client, ns] : a->finished) total[client] += ns;
    if (a->running.has_value())
      total[a->running->client] += std::max<int64_t>(0, now - a->running->since);
  }
  std::vector<std::pair<ClientId, int64_t>> out(total.begin(), total.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace pw
