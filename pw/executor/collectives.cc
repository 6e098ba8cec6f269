#include "pw/executor/collectives.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "pw/base/spin_wait.h"
#include "pw/base/status_macros.h"

namespace pw {

void Collectives::Rendezvous::Publish(absl::Status s) {
  status = std::move(s);
  state.store(kFinished, std::memory_order_seq_cst);
  WakeAll(state, sleepers);
}

const absl::Status& Collectives::Rendezvous::Wait() {
  for (uint32_t s = state.load(std::memory_order_acquire); s != kFinished;
       s = state.load(std::memory_order_acquire)) {
    SpinThenWait(state, s, sleepers);
  }
  return status;
}

absl::StatusOr<std::shared_ptr<Collectives::Rendezvous>> Collectives::Join(
    const CollectiveKey& key, absl::Span<const DeviceId> devices, int rank,
    const CollectivePeers::Processes* scatter, size_t bytes, size_t element) {
  pw::MutexLock lock(&mu_);
  for (DeviceId d : devices) {
    auto it = dead_.find(d);
    if (it != dead_.end()) return it->second;
  }
  if (!failed_launches_.empty()) {
    auto it = failed_launches_.find(std::make_pair(key.run, key.node));
    if (it != failed_launches_.end()) return it->second;
  }
  if (!cancelled_runs_.empty()) {
    auto it = cancelled_runs_.find(key.run);
    if (it != cancelled_runs_.end()) return it->second;
  }
  auto& slot = pending_[key];
  if (slot == nullptr) {
    size_t local = devices.size();
    if (peers_ != nullptr)
      local = std::count_if(devices.begin(), devices.end(),
                            [&](DeviceId d) { return peers_->IsLocal(d); });
    slot = std::make_shared<Rendezvous>(devices, local);
    pw::MutexLock rlock(&slot->remote_mu);
    if (scatter != nullptr) {
      auto sc = std::make_unique<Rendezvous::Scatter>();
      sc->procs = scatter->count;
      sc->self = scatter->self;
      sc->bytes = bytes;
      sc->element = element;
      sc->partial.resize(bytes);
      sc->received1.resize((sc->End(sc->self) - sc->Begin(sc->self)) * sc->procs);
      sc->gathered.resize(bytes);
      slot->scatter = std::move(sc);
    }
    if (auto early = early_.find(key); early != early_.end()) {
      for (auto& [rank, bytes] : early->second) {
        if (rank >= 0 && rank < static_cast<int>(slot->remote_inputs.size()) &&
            slot->remote_inputs[rank].empty()) {
          slot->remote_inputs[rank] = std::move(bytes);
          slot->remote_arrived.fetch_add(1, std::memory_order_release);
        }
      }
      early_.erase(early);
    }
    if (auto early = early_pieces_.find(key); early != early_pieces_.end()) {
      for (EarlyPiece& p : early->second) StorePiece(*slot, p.phase, p.from, p.offset, p.bytes);
      early_pieces_.erase(early);
    }
  }
  if (slot->devices.size() != devices.size() || rank < 0 ||
      rank >= static_cast<int>(devices.size()) || (scatter != nullptr) != (slot->scatter != nullptr)) {
    return absl::InternalError(absl::StrCat("collective run ", key.run, " node ", key.node,
                                            " op ", key.op, ": shards disagree on the slice"));
  }
  return slot;
}

absl::Status Collectives::Run(const CollectiveKey& key, absl::Span<const DeviceId> devices,
                              int rank, const void* input, size_t input_bytes, void* output,
                              size_t output_bytes, const Combine& combine) {
  PW_ASSIGN_OR_RETURN(std::shared_ptr<Rendezvous> r, Join(key, devices, rank, nullptr, 0, 0));
  if (r->state.load(std::memory_order_acquire) != Rendezvous::kPending) return r->Wait();
  r->inputs[rank] = input;
  r->outputs[rank] = output;
  if (r->local < r->devices.size())
    r->own_inputs[rank].assign(static_cast<const char*>(input), input_bytes);
  if (r->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == r->local) {
    // Last to arrive: every local slot is written. Claim before touching other shards' buffers,
    // so an abort that won cannot have let them return.
    if (r->local < r->devices.size()) {
      CombineAcrossProcesses(key, *r, input_bytes, output_bytes, combine);
    } else if (r->Claim()) {
      r->Publish(combine(absl::MakeConstSpan(r->inputs), absl::MakeConstSpan(r->outputs)));
    }
    pw::MutexLock lock(&mu_);
    auto it = pending_.find(key);
    if (it != pending_.end() && it->second == r) pending_.erase(it);
  } else if (r->local < r->devices.size()) {
    // The last remote input may be waiting in this process's mailbox: deliver it (and so
    // combine) here rather than wait for the thread that receives it.
    auto finished = [&r] {
      return r->state.load(std::memory_order_acquire) == Rendezvous::kFinished;
    };
    PollUntil(finished);
  }
  return r->Wait();
}

void Collectives::CombineAcrossProcesses(const CollectiveKey& key, Rendezvous& r,
                                         size_t input_bytes, size_t output_bytes,
                                         const Combine& combine) {
  const size_t n = r.devices.size();
  std::vector<int> ranks;
  std::vector<std::string> inputs;
  for (size_t i = 0; i < n; ++i) {
    if (!peers_->IsLocal(r.devices[i])) continue;
    ranks.push_back(static_cast<int>(i));
    inputs.push_back(std::move(r.own_inputs[i]));  // Not r.inputs: not claimed yet.
  }
  peers_->Send(key, r.devices, std::move(ranks), std::move(inputs));
  r.key = key;
  r.combine = &combine;
  r.input_bytes = input_bytes;
  r.output_bytes = output_bytes;
  // seq_cst, paired with Deliver's (count the input, then read `sent`): if Deliver missed this,
  // the wait below sees its input.
  r.sent.store(true, std::memory_order_seq_cst);
  // Wait for the other processes' inputs, or for an abort (a removed device, a failed launch) or
  // a delivery that combined: yielding the core a bounded number of times (they arrive within
  // microseconds when the processes keep pace), then asleep.
  auto done = [&r] {
    return r.remote_arrived.load(std::memory_order_acquire) == r.devices.size() - r.local ||
           r.state.load(std::memory_order_acquire) != Rendezvous::kPending;
  };
  if (!AwaitRemote(key, r, done, "other processes' inputs")) return;
  pw::MutexLock lock(&r.remote_mu);
  // Claim before touching the local shards' buffers: an abort that claimed first has published
  // its status and let those shards return.
  if (!r.Claim()) return;
  r.Publish(CombineClaimed(key, r, input_bytes, output_bytes, combine));
}

template <typename F>
bool Collectives::AwaitRemote(const CollectiveKey& key, Rendezvous& r, const F& done,
                              const char* what) {
  PollUntil(done);
  pw::MutexLock lock(&r.remote_mu);
  if (r.remote_mu.AwaitWithTimeout(done, timeout_)) {
    return r.state.load(std::memory_order_acquire) == Rendezvous::kPending;
  }
  if (r.Claim()) {
    r.Publish(absl::DeadlineExceededError(absl::StrCat(
        "collective run ", key.run, " node ", key.node, " op ", key.op, ": waited ",
        absl::FormatDuration(timeout_), " for ", what, " (a peer process stalled or lost)")));
  }
  return false;
}

absl::Status Collectives::AllReduce(const CollectiveKey& key, absl::Span<const DeviceId> devices,
                                    int rank, const void* input, void* output, size_t bytes,
                                    size_t element_size, const Reduce& reduce,
                                    Algorithm algorithm) {
  // Small buffers (every dispatch-bench step) decide here, before asking where the ranks are.
  const bool scatter_fits = algorithm == Algorithm::kAuto && peers_ != nullptr &&
                            bytes >= kScatterMinBytes && element_size != 0 &&
                            bytes % element_size == 0;
  CollectivePeers::Processes procs;
  if (scatter_fits) procs = peers_->ProcessesOf(devices);
  if (!scatter_fits || procs.count < 3) {
    return Run(key, devices, rank, input, bytes, output, bytes,
               [&](absl::Span<const void* const> in, absl::Span<void* const> out) {
                 std::memcpy(out[0], in[0], bytes);
                 for (size_t i = 1; i < in.size(); ++i) reduce(out[0], in[i], bytes);
                 for (size_t i = 1; i < out.size(); ++i) std::memcpy(out[i], out[0], bytes);
                 return absl::OkStatus();
               });
  }
  PW_ASSIGN_OR_RETURN(std::shared_ptr<Rendezvous> r,
                      Join(key, devices, rank, &procs, bytes, element_size));
  if (r->state.load(std::memory_order_acquire) != Rendezvous::kPending) return r->Wait();
  r->inputs[rank] = input;
  r->outputs[rank] = output;
  r->own_inputs[rank].assign(static_cast<const char*>(input), bytes);
  if (r->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == r->local) {
    ScatterAcrossProcesses(key, *r, reduce);
    pw::MutexLock lock(&mu_);
    auto it = pending_.find(key);
    if (it != pending_.end() && it->second == r) pending_.erase(it);
  } else {
    PollUntil([&r] { return r->state.load(std::memory_order_acquire) == Rendezvous::kFinished; });
  }
  return r->Wait();
}

void Collectives::ScatterAcrossProcesses(const CollectiveKey& key, Rendezvous& r,
                                         const Reduce& reduce) {
  Rendezvous::Scatter& sc = *r.scatter;
  // 1. This process's shards, reduced into `partial` (from their copies: not claimed yet).
  std::vector<const void*> local;
  for (size_t i = 0; i < r.devices.size(); ++i)
    if (peers_->IsLocal(r.devices[i])) local.push_back(r.own_inputs[i].data());
  std::memcpy(sc.partial.data(), local[0], sc.bytes);
  for (size_t i = 1; i < local.size(); ++i) reduce(sc.partial.data(), local[i], sc.bytes);
  // Sends [begin, end) of `from_buffer` to process `to` in pieces, offsets relative to begin.
  auto send = [&](int phase, int to, const char* data, size_t length) {
    for (size_t off = 0; off < length; off += kPieceBytes) {
      const size_t n = std::min(kPieceBytes, length - off);
      peers_->SendPiece(key, r.devices, phase, to, sc.self, off, std::string(data + off, n));
    }
  };
  // 2. Reduce-scatter: process q gets our copy of chunk q; we reduce everyone's copy of ours.
  for (int q = 0; q < sc.procs; ++q) {
    if (q != sc.self) send(1, q, sc.partial.data() + sc.Begin(q), sc.End(q) - sc.Begin(q));
  }
  const size_t mine = sc.End(sc.self) - sc.Begin(sc.self);
  auto reduced = [&] { return sc.got1.load(std::memory_order_acquire) == mine * (sc.procs - 1) ||
                              r.state.load(std::memory_order_acquire) != Rendezvous::kPending; };
  if (!AwaitRemote(key, r, reduced, "the reduce-scatter's chunks")) return;
  char* chunk = sc.partial.data() + sc.Begin(sc.self);
  for (int q = 0; q < sc.procs; ++q) {
    if (q != sc.self) reduce(chunk, sc.received1.data() + q * mine, mine);
  }
  // 3. All-gather: our reduced chunk to every other process; theirs into `gathered`.
  for (int q = 0; q < sc.procs; ++q) {
    if (q != sc.self) send(2, q, chunk, mine);
  }
  auto gathered = [&] { return sc.got2.load(std::memory_order_acquire) == sc.bytes - mine ||
                               r.state.load(std::memory_order_acquire) != Rendezvous::kPending; };
  if (!AwaitRemote(key, r, gathered, "the all-gather's chunks")) return;
  pw::MutexLock lock(&r.remote_mu);
  if (!r.Claim()) return;  // Aborted: the local shards have returned; their buffers are gone.
  for (size_t i = 0; i < r.devices.size(); ++i) {
    if (!peers_->IsLocal(r.devices[i])) continue;
    char* out = static_cast<char*>(r.outputs[i]);
    std::memcpy(out, sc.gathered.data(), sc.Begin(sc.self));
    std::memcpy(out + sc.Begin(sc.self), chunk, mine);
    std::memcpy(out + sc.End(sc.self), sc.gathered.data() + sc.End(sc.self),
                sc.bytes - sc.End(sc.self));
  }
  r.Publish(absl::OkStatus());
}

bool Collectives::StorePiece(Rendezvous& r, int phase, int from, size_t offset,
                             absl::string_view bytes) {
  Rendezvous::Scatter* sc = r.scatter.get();
  if (sc == nullptr || from < 0 || from >= sc->procs || from == sc->self) return false;
  const size_t mine = sc->End(sc->self) - sc->Begin(sc->self);
  if (phase == 1 && offset <= mine && bytes.size() <= mine - offset) {
    std::memcpy(sc->received1.data() + from * mine + offset, bytes.data(), bytes.size());
    sc->got1.fetch_add(bytes.size(), std::memory_order_release);
    return true;
  }
  const size_t theirs = sc->End(from) - sc->Begin(from);
  if (phase == 2 && offset <= theirs && bytes.size() <= theirs - offset) {
    std::memcpy(sc->gathered.data() + sc->Begin(from) + offset, bytes.data(), bytes.size());
    sc->got2.fetch_add(bytes.size(), std::memory_order_release);
    return true;
  }
  return false;
}

void Collectives::DeliverPiece(const CollectiveKey& key, int phase, int from, size_t offset,
                               std::string bytes) {
  std::shared_ptr<Rendezvous> r;
  {
    pw::MutexLock lock(&mu_);
    if (failed_launches_.contains(std::make_pair(key.run, key.node)) ||
        forgotten_.contains(key.run))
      return;
    auto it = pending_.find(key);
    if (it == pending_.end()) {
      early_pieces_[key].push_back({phase, from, offset, std::move(bytes)});
      return;
    }
    r = it->second;
  }
  pw::MutexLock lock(&r->remote_mu);  // Its release re-evaluates the combining shard's wait.
  StorePiece(*r, phase, from, offset, bytes);
}

absl::Status Collectives::CombineClaimed(const CollectiveKey& key, Rendezvous& r,
                                         size_t input_bytes, size_t output_bytes,
                                         const Combine& combine) {
  const size_t n = r.devices.size();
  std::vector<const void*> in(n);
  std::vector<void*> out(n);
  std::vector<std::string> scratch(n);
  for (size_t i = 0; i < n; ++i) {
    if (peers_->IsLocal(r.devices[i])) {
      in[i] = r.inputs[i];
      out[i] = r.outputs[i];
    } else {
      if (r.remote_inputs[i].size() != input_bytes) {
        return absl::InternalError(absl::StrCat(
            "collective run ", key.run, " node ", key.node, " op ", key.op, ": rank ", i, " sent ",
            r.remote_inputs[i].size(), " bytes, expected ", input_bytes));
      }
      in[i] = r.remote_inputs[i].data();
      scratch[i].resize(output_bytes);
      out[i] = scratch[i].data();
    }
  }
  return combine(absl::MakeConstSpan(in), absl::MakeConstSpan(out));
}

void Collectives::Deliver(const CollectiveKey& key, int rank, std::string input) {
  std::shared_ptr<Rendezvous> r;
  {
    pw::MutexLock lock(&mu_);
    if (failed_launches_.contains(std::make_pair(key.run, key.node)) ||
        forgotten_.contains(key.run))
      return;
    auto it = pending_.find(key);
    if (it == pending_.end()) {
      early_[key].emplace_back(rank, std::move(input));
      return;
    }
    r = it->second;
  }
  pw::MutexLock lock(&r->remote_mu);
  if (rank < 0 || rank >= static_cast<int>(r->remote_inputs.size()) ||
      !r->remote_inputs[rank].empty())
    return;  // Not a remote rank of this collective, or a duplicate.
  r->remote_inputs[rank] = std::move(input);
  // The last input, once the local inputs are sent: combine here (see Rendezvous::sent).
  if (r->remote_arrived.fetch_add(1, std::memory_order_seq_cst) + 1 ==
          r->devices.size() - r->local &&
      r->sent.load(std::memory_order_seq_cst) && r->Claim()) {
    r->Publish(CombineClaimed(r->key, *r, r->input_bytes, r->output_bytes, *r->combine));
  }
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

void Collectives::RestoreDevice(DeviceId device) {
  pw::MutexLock lock(&mu_);
  dead_.erase(device);
}

void Collectives::FailLaunch(int64_t run, int32_t node, const absl::Status& reason,
                             absl::Span<const DeviceId> devices) {
  {
    pw::MutexLock lock(&mu_);
    if (forgotten_.contains(run)) return;  // A late failure of a run that has ended.
    // A repeat with devices still tells the peers (the first may have come without them).
    if (!failed_launches_.emplace(std::make_pair(run, node), reason).second && devices.empty())
      return;
    for (auto it = early_.begin(); it != early_.end();) {
      if (it->first.run == run && it->first.node == node) early_.erase(it++);
      else ++it;
    }
    for (auto it = early_pieces_.begin(); it != early_pieces_.end();) {
      if (it->first.run == run && it->first.node == node) early_pieces_.erase(it++);
      else ++it;
    }
  }
  if (peers_ != nullptr && !devices.empty()) peers_->SendFailure(run, node, devices, reason);
  AbortPending(reason, [run, node](const CollectiveKey& k, const Rendezvous&) {
    return k.run == run && k.node == node;
  });
}

void Collectives::CancelRun(int64_t run, const absl::Status& reason) {
  {
    pw::MutexLock lock(&mu_);
    if (forgotten_.contains(run)) return;
    cancelled_runs_.try_emplace(run, reason);
  }
  AbortPending(reason, [run](const CollectiveKey& k, const Rendezvous&) { return k.run == run; });
}

absl::Status Collectives::LaunchFailure(int64_t run, int32_t node) const {
  pw::MutexLock lock(&mu_);
  auto it = failed_launches_.find(std::make_pair(run, node));
  return it == failed_launches_.end() ? absl::OkStatus() : it->second;
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
  for (auto& r : aborted) {
    if (r->Claim()) r->Publish(reason);
    pw::MutexLock wake(&r->remote_mu);  // Re-evaluates a cross-process wait's condition.
  }
}

void Collectives::ForgetRun(int64_t run) {
  pw::MutexLock lock(&mu_);
  cancelled_runs_.erase(run);
  for (auto it = failed_launches_.begin(); it != failed_launches_.end();) {
    if (it->first.first == run) failed_launches_.erase(it++);
    else ++it;
  }
  for (auto it = early_.begin(); it != early_.end();) {
    if (it->first.run == run) early_.erase(it++);
    else ++it;
  }
  for (auto it = early_pieces_.begin(); it != early_pieces_.end();) {
    if (it->first.run == run) early_pieces_.erase(it++);
    else ++it;
  }
  if (!forgotten_.insert(run).second) return;
  forgotten_order_.push_back(run);
  if (forgotten_order_.size() > kForgottenRuns) {
    forgotten_.erase(forgotten_order_.front());
    forgotten_order_.pop_front();
  }
}

size_t Collectives::records() const {
  pw::MutexLock lock(&mu_);
  return failed_launches_.size() + early_.size() + early_pieces_.size() + cancelled_runs_.size();
}

size_t Collectives::pending() const {
  pw::MutexLock lock(&mu_);
  return pending_.size();
}

}  // namespace pw
