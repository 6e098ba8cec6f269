#include "pw/controller/output_ids.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"

namespace pw {

absl::Status OutputIds::CheckLease(ClientId client, int64_t count) const {
  if (count <= 0 || count > kMaxLeaseIds)
    return absl::InvalidArgumentError(absl::StrCat(
        "ReserveBufferIds: count ", count, " is not in [1, ", kMaxLeaseIds, "]"));
  pw::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it != clients_.end() && it->second.leases.size() >= kMaxOpenLeases)
    return absl::ResourceExhaustedError(absl::StrCat(
        client.ToString(), " holds ", kMaxOpenLeases,
        " ranges of buffer ids with unused ids already: use them before reserving more"));
  return absl::OkStatus();
}

absl::Status OutputIds::Lease(ClientId client, BufferId first, int64_t count) {
  PW_RETURN_IF_ERROR(CheckLease(client, count));
  pw::MutexLock lock(&mu_);
  clients_[client].leases.push_back({first.value(), first.value() + count});
  return absl::OkStatus();
}

absl::Status OutputIds::Claim(ClientId client, const std::vector<BufferId>& ids) {
  pw::MutexLock lock(&mu_);
  auto c = clients_.find(client);
  for (BufferId id : ids) {
    auto lease = c == clients_.end()
                     ? std::vector<Lease_>::iterator()
                     : std::find_if(c->second.leases.begin(), c->second.leases.end(),
                                    [&](const Lease_& l) {
                                      return id.value() >= l.next && id.value() < l.end;
                                    });
    if (c == clients_.end() || lease == c->second.leases.end())
      return absl::InvalidArgumentError(absl::StrCat(
          "output id ", id.ToString(), " is not an unused id this client reserved "
          "(ReserveBufferIds; each id names one output once, in increasing order)"));
    lease->next = id.value() + 1;
    if (lease->next == lease->end) c->second.leases.erase(lease);
  }
  return absl::OkStatus();
}

void OutputIds::Burn(ClientId client, const std::vector<BufferId>& ids) {
  for (BufferId id : ids) Claim(client, {id}).IgnoreError();
}

void OutputIds::Failed(ClientId client, const std::vector<BufferId>& ids, const absl::Status& why) {
  pw::MutexLock lock(&mu_);
  PerClient& c = clients_[client];
  for (BufferId id : ids) {
    if (!c.failed.insert_or_assign(id, why).second) continue;
    c.failed_order.push_back(id);
  }
  while (c.failed.size() > kMaxFailuresRemembered && !c.failed_order.empty()) {
    c.failed.erase(c.failed_order.front());
    c.failed_order.pop_front();
  }
  // The order may name forgotten failures: compacted when it has grown to twice the bound.
  if (c.failed_order.size() > 2 * kMaxFailuresRemembered) {
    std::deque<BufferId> live;
    for (BufferId id : c.failed_order)
      if (c.failed.contains(id)) live.push_back(id);
    c.failed_order.swap(live);
  }
}

std::optional<absl::Status> OutputIds::FailureOf(ClientId client, BufferId id) const {
  pw::MutexLock lock(&mu_);
  auto c = clients_.find(client);
  if (c == clients_.end()) return std::nullopt;
  auto it = c->second.failed.find(id);
  if (it == c->second.failed.end()) return std::nullopt;
  return it->second;
}

bool OutputIds::Forget(ClientId client, BufferId id) {
  pw::MutexLock lock(&mu_);
  auto c = clients_.find(client);
  return c != clients_.end() && c->second.failed.erase(id) > 0;
}

void OutputIds::Drop(ClientId client) {
  pw::MutexLock lock(&mu_);
  clients_.erase(client);
}

}  // namespace pw
