#include "pw/executor/collectives.h"

#include "absl/strings/str_cat.h"

namespace pw {

absl::Status Collectives::Run(const CollectiveKey& key, absl::Span<const DeviceId> devices,
                              int rank, const void* input, void* output,
                              const Combine& combine) {
  std::shared_ptr<Rendezvous> r;
  {
    absl::MutexLock lock(&mu_);
    for (DeviceId d : devices) {
      auto it = dead_.find(d);
      if (it != dead_.end()) return it->second;
    }
    auto& slot = pending_[key];
    if (slot == nullptr)
      slot = std::make_shared<Rendezvous>(std::vector<DeviceId>(devices.begin(), devices.end()));
    r = slot;
  }
  if (r->devices.size() != devices.size()) {
    return absl::InternalError(absl::StrCat("collective run ", key.run, " node ", key.node,
                                            " op ", key.op, ": shards disagree on the slice size"));
  }
  bool last = false;
  {
    absl::MutexLock lock(&r->mu);
    if (r->done) return r->status;  // Aborted before we arrived.
    r->inputs[rank] = input;
    r->outputs[rank] = output;
    last = ++r->arrived == r->devices.size();
    if (last) {
      r->status = combine(r->inputs, r->outputs);
      r->done = true;
    } else {
      r->mu.Await(absl::Condition(+[](bool* d) { return *d; }, &r->done));
    }
  }
  if (last) {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(key);
    if (it != pending_.end() && it->second == r) pending_.erase(it);
  }
  absl::MutexLock lock(&r->mu);
  return r->status;
}

void Collectives::AbortDevice(DeviceId device, const absl::Status& reason) {
  std::vector<std::shared_ptr<Rendezvous>> aborted;
  {
    absl::MutexLock lock(&mu_);
    dead_[device] = reason;
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool involved = false;
      for (DeviceId d : it->second->devices) involved |= d == device;
      if (involved) {
        aborted.push_back(it->second);
        pending_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : aborted) {
    absl::MutexLock lock(&r->mu);
    if (!r->done) {
      r->done = true;
      r->status = reason;
    }
  }
}

size_t Collectives::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

}  // namespace pw
