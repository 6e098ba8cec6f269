#include "pw/executor/collectives.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pw/base/spin_wait.h"

namespace pw {

void Collectives::Rendezvous::Publish(absl::Status s) {
  status = std::move(s);
  state.store(kFinished, std::memory_order_release);
  WakeAll(state);
}

const absl::Status& Collectives::Rendezvous::Wait() {
  for (uint32_t s = state.load(std::memory_order_acquire); s != kFinished;
       s = state.load(std::memory_order_acquire)) {
    SpinThenWait(state, s);
  }
  return status;
}

absl::Status Collectives::Run(const CollectiveKey& key, absl::Span<const DeviceId> devices,
                              int rank, const void* input, void* output,
                              const Combine& combine) {
  std::shared_ptr<Rendezvous> r;
  {
    pw::MutexLock lock(&mu_);
    for (DeviceId d : devices) {
      auto it = dead_.find(d);
      if (it != dead_.end()) return it->second;
    }
    if (!failed_launches_.empty()) {
      auto it = failed_launches_.find(std::make_pair(key.run, key.node));
      if (it != failed_launches_.end()) return it->second;
    }
    auto& slot = pending_[key];
    if (slot == nullptr)
      slot = std::make_shared<Rendezvous>(devices);
    r = slot;
  }
  if (r->devices.size() != devices.size() || rank < 0 ||
      rank >= static_cast<int>(devices.size())) {
    return absl::InternalError(absl::StrCat("collective run ", key.run, " node ", key.node,
                                            " op ", key.op, ": shards disagree on the slice"));
  }
  if (r->state.load(std::memory_order_acquire) != Rendezvous::kPending) return r->Wait();
  r->inputs[rank] = input;
  r->outputs[rank] = output;
  if (r->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == r->devices.size()) {
    // Last to arrive: every slot is written. Claim before touching other shards' buffers, so an
    // abort that won cannot have let them return.
    if (r->Claim()) r->Publish(combine(absl::MakeConstSpan(r->inputs), absl::MakeConstSpan(r->outputs)));
    pw::MutexLock lock(&mu_);
    auto it = pending_.find(key);
    if (it != pending_.end() && it->second == r) pending_.erase(it);
  }
  return r->Wait();
}

// Both record the failure first, so a rendezvous created after the scan fails in Run().
void Collectives::AbortDevice(DeviceId device, const absl::Status& reason) {
  {
    pw::MutexLock lock(&mu_);
    dead_[device] = reason;
  }
  AbortPending(reason, [device](const CollectiveKey&, const Rendezvous& r) {
    return std::find(r.devices.begin(), r.devices.end(), device) != r.devices.end();
  });
}

void Collectives::FailLaunch(int64_t run, int32_t node, const absl::Status& reason) {
  {
    pw::MutexLock lock(&mu_);
    failed_launches_.emplace(std::make_pair(run, node), reason);
  }
  AbortPending(reason, [run, node](const CollectiveKey& k, const Rendezvous&) {
    return k.run == run && k.node == node;
  });
}

void Collectives::AbortPending(
    const absl::Status& reason,
    absl::FunctionRef<bool(const CollectiveKey&, const Rendezvous&)> matches) {
  std::vector<std::shared_ptr<Rendezvous>> aborted;
  {
    pw::MutexLock lock(&mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (matches(it->first, *it->second)) {
        aborted.push_back(it->second);
        pending_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : aborted)
    if (r->Claim()) r->Publish(reason);
}

size_t Collectives::pending() const {
  pw::MutexLock lock(&mu_);
  return pending_.size();
}

}  // namespace pw
