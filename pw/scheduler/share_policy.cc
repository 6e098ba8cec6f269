#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "pw/base/check.h"
#include "pw/scheduler/scheduling_policy.h"

namespace pw {

SharePolicy::Queue& SharePolicy::QueueOf(const std::shared_ptr<const Tenant>& tenant) {
  Queue& q = queues_[tenant->id()];
  if (q.tenant == nullptr) q.tenant = tenant;
  return q;
}

void SharePolicy::Add(std::unique_ptr<ScheduleRequest> r) {
  if (r->work.spans_islands) spanning_.push_back(r->work.seq);
  Queue& q = QueueOf(r->work.tenant);
  // A tenant with nothing queued starts no earlier than the island's virtual time: idleness
  // earns nothing, and corrections of requests still running from before do not take it back
  // before it.
  if (q.requests.empty()) q.floor = virtual_time_;
  q.requests.push_back(std::move(r));
  ++size_;
}

bool SharePolicy::MayGo(const ScheduleRequest& r) const {
  return !r.work.spans_islands || (!spanning_.empty() && spanning_.front() == r.work.seq);
}

ScheduleRequest* SharePolicy::Peek() {
  picked_ = nullptr;
  for (auto& [id, q] : queues_) {
    if (q.requests.empty() || !MayGo(*q.requests.front())) continue;
    if (picked_ == nullptr || q.head_start() < picked_->head_start() ||
        (q.head_start() == picked_->head_start() && id < picked_->tenant->id()))
      picked_ = &q;
  }
  return picked_ == nullptr ? nullptr : picked_->requests.front().get();
}

std::unique_ptr<ScheduleRequest> SharePolicy::Pop() {
  PW_CHECK(picked_ != nullptr && !picked_->requests.empty(), "Pop without a Peek that found one");
  Queue& q = *picked_;
  picked_ = nullptr;
  std::unique_ptr<ScheduleRequest> r = std::move(q.requests.front());
  q.requests.pop_front();
  --size_;
  if (r->work.spans_islands) spanning_.pop_front();  // It was the earliest (MayGo).
  // A head that corrections moved before the virtual time does not move it back (tenants that
  // join start at it).
  const double start = q.head_start();
  virtual_time_ = std::max(virtual_time_, start);
  r->charged_share = q.tenant->share();
  q.finish = start + static_cast<double>(r->estimated_ns) / r->charged_share;
  ++q.running;
  // Idle tenants the virtual time has passed would start at it anyway: their entries go (not
  // while a request of theirs runs: its correction is still to come).
  if (queues_.size() > 64)
    absl::erase_if(queues_, [this](const auto& kv) {
      return kv.second.requests.empty() && kv.second.running == 0 &&
             kv.second.finish <= virtual_time_;
    });
  return r;
}

void SharePolicy::Finished(const ScheduleRequest& r, int64_t actual_ns) {
  auto it = queues_.find(r.work.tenant->id());
  if (it == queues_.end() || !(r.charged_share > 0)) return;  // Not dispatched by this policy.
  Queue& q = it->second;
  --q.running;
  // At the share it was charged at (one changed since applies to later requests).
  const double correction = static_cast<double>(actual_ns - r.estimated_ns) / r.charged_share;
  // Its next request's start moves with it (head_start), before the virtual time too: what its
  // requests took under their estimates is given back, down to the virtual time its queue last
  // started from empty at (at most their sum; never credit for idleness), the same whether the
  // request finishes before or after its tenant's queue refills.
  q.finish += correction;
}

absl::flat_hash_map<int64_t, int64_t> SharePolicy::QueuedByTenant() const {
  absl::flat_hash_map<int64_t, int64_t> n;
  for (const auto& [id, q] : queues_)
    if (!q.requests.empty()) n[id] = static_cast<int64_t>(q.requests.size());
  return n;
}

}  // namespace pw
