#include "pw/worker/worker.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/pjrt/shard_executable.h"

namespace pw {

std::string Worker::NodeWhere(const HostWork& work, const NodeWork& node, DeviceId device) {
  return absl::StrCat(work.run.ToString(), " program '", work.program->program, "' node '", node.name,
                      "' on ", device.ToString());
}

ObjectStore::Memory Worker::ReserveMemory(Device& device, int64_t bytes,
                                          Future<ReservationRef>* pending) {
  if (ReservationRef granted = device.memory().TryReserve(bytes)) return granted;
  Future<ReservationRef> f = device.memory().Reserve(bytes);
  if (pending != nullptr) *pending = f;
  return f;
}

namespace {

// The error of `f` if it is already ready with one.
template <typename T>
absl::Status FailedAlready(const Future<T>& f) {
  return f.IsReady() ? f.status() : absl::OkStatus();
}

}  // namespace

Worker::Worker(HostId host, IslandId island, const std::vector<DeviceSpec>& devices,
               Collectives* collectives, PeerLookup peers,
               std::shared_ptr<pjrt::PjrtBackend> pjrt)
    : host_(host),
      island_(island),
      collectives_(collectives),
      peers_(std::move(peers)),
      pjrt_(std::move(pjrt)),
      data_plane_(absl::StrCat("pw-data", host.value())),
      dispatch_(absl::StrCat("pw-disp", host.value())) {
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceSpec& d = devices[i];
    devices_.emplace(d.id, std::make_unique<Device>(d.id, d.host, d.island, d.memory_bytes));
  }
}

Worker::~Worker() {
  absl::Status reason = absl::CancelledError(absl::StrCat(host_.ToString(), " shut down"));
  for (auto& [id, dev] : devices_) {
    dev->Remove(reason);
    collectives_->AbortDevice(id, reason);
  }
}

absl::Status Worker::LoadFunction(FunctionId id, const FunctionDef& def) {
  // A per-shard XLA module is compiled here, at registration (on the caller's thread, not the
  // dispatch thread, and under no lock dispatch takes): its first run then finds it compiled,
  // and a module XLA rejects fails its registration, naming the function. SPMD modules depend on
  // their slice's placement and compile at first use.
  if (const auto* hlo = std::get_if<StableHloFunctionDef>(&def);
      hlo != nullptr && hlo->num_partitions == 1 && pjrt_ != nullptr) {
    PW_RETURN_IF_ERROR(Annotate(pjrt::PjrtShardExecutable::Precompile(pjrt_, *hlo),
                                host_.ToString()));
  }
  pw::MutexLock lock(&fn_mu_);
  functions_[id] = def;
  return absl::OkStatus();
}

absl::StatusOr<ExecutableRef> Worker::LoadExecutable(FunctionId id,
                                                     absl::Span<const DeviceId> slice_devices) {
  FunctionDef def;
  const int num_shards = static_cast<int>(slice_devices.size());
  ExecutableKey key(id, num_shards, {});
  {
    pw::MutexLock lock(&fn_mu_);
    auto fit = functions_.find(id);
    if (fit == functions_.end())
      return absl::NotFoundError(absl::StrCat(id.ToString(), " was never loaded on ",
                                              host_.ToString()));
    const auto* hlo = std::get_if<StableHloFunctionDef>(&fit->second);
    if (hlo != nullptr && hlo->num_partitions > 1)
      std::get<2>(key).assign(slice_devices.begin(), slice_devices.end());
    auto it = executables_.find(key);
    if (it != executables_.end()) return it->second;
    def = fit->second;
  }
  // Loaded outside fn_mu_ (an SPMD module compiles here; others were compiled at registration),
  // so registering a function never waits behind it; a racing load of the same key is harmless.
  ExecutableRef exe;
  if (const auto* hlo = std::get_if<StableHloFunctionDef>(&def); hlo == nullptr) {
    PW_ASSIGN_OR_RETURN(exe, CompileNative(std::get<NativeFunctionDef>(def), num_shards));
  } else {
    if (pjrt_ == nullptr)
      return absl::FailedPreconditionError(absl::StrCat(
          host_.ToString(), " has no PJRT plugin configured for StableHLO functions"));
    PW_ASSIGN_OR_RETURN(exe, pjrt::PjrtShardExecutable::Compile(pjrt_, *hlo, slice_devices));
  }
  pw::MutexLock lock(&fn_mu_);
  return executables_.emplace(std::move(key), exe).first->second;
}

Device* Worker::FindDevice(DeviceId id) const {
  auto it = devices_.find(id);
  return it == devices_.end() ? nullptr : it->second.get();
}

DispatchAck Worker::Dispatch(HostWork work) {
  Promise<> enqueued, done;
  DispatchAck ack{enqueued.future(), done.future()};
  dispatch_.Post([this, work = std::make_shared<const HostWork>(std::move(work)),
                  enqueued = std::move(enqueued), done = std::move(done)]() mutable {
    RunHostWork(std::move(work), std::move(enqueued), std::move(done));
  });
  return ack;
}

// One HostWork's compute shards on this host, made in one allocation: dispatch creates them and
// the devices run and end them, so an allocation per shard would be freed on another thread.
// Alive until its countdown completes (every shard ended: see RunHostWork) and no transfer
// holds it.
struct Worker::Dispatched {
  std::shared_ptr<const HostWork> work;
  std::vector<ExecutableRef> executables;  // What the shards' `exe` point to.
  std::vector<Shard> shards;               // Reserved up front: never reallocated.
  alignas(64) Countdown done;  // Every shard and transfer of the work. Written by all shards.
  // Memory of handed-on intermediates no shard of the work took (a reader's dispatch failed):
  // held until the work's shards have ended, as the store would have held it.
  std::vector<ObjectStore::Memory> unclaimed;
};

// The dispatch thread's state while it dispatches one work.
struct Worker::Dispatching {
  // Intermediates that a node of the work produces and a later node of it reads last (a chain's
  // steps): dispatch hands each shard's future and memory from producer to readers here, without
  // the store's lock and lookups; the last reader's shard takes the memory. Values produced or
  // read last in another work (sequential dispatch sends a node at a time) go through the store.
  std::vector<bool> local;  // By value index: read last by a node of this work.
  absl::flat_hash_map<std::pair<int, DeviceId>, ObjectStore::Shard> handoffs;

  // Shards go onto each device's queue in batches, one lock each: the first alone (so the device
  // starts at once), then batches of twice the size, up to kMaxBatch.
  static constexpr size_t kMaxBatch = 32;
  struct Batch {
    Device* device;
    std::vector<Device::Work> items;
    size_t size = 1;
  };
  absl::InlinedVector<Batch, 4> batches;
  void Enqueue(Device* device, Device::Work work) {
    auto b = std::find_if(batches.begin(), batches.end(),
                          [device](const Batch& x) { return x.device == device; });
    if (b == batches.end()) b = batches.insert(batches.end(), Batch{device, {}});
    b->items.push_back(std::move(work));
    if (b->items.size() < b->size) return;
    device->EnqueueAll(absl::MakeSpan(b->items));
    b->items.clear();
    b->size = std::min(2 * b->size, kMaxBatch);
  }
  void EnqueueRest() {
    for (Batch& b : batches) {
      if (!b.items.empty()) b.device->EnqueueAll(absl::MakeSpan(b.items));
      b.items.clear();
    }
  }
};

void Worker::ShardEnd::operator()(Shard* shard) const {
  // What the shard holds goes now, as if it were freed: buffers and promises (an unset one fails
  // its future) must not wait for the rest of its work.
  shard->inputs.clear();
  shard->memory.clear();
  shard->outputs.clear();
  shard->last_read.clear();
  shard->release.clear();
  std::vector<DeviceBufferRef>().swap(shard->held);
  absl::Status ended = shard->ended.has_value()
                           ? *std::move(shard->ended)
                           : absl::CancelledError(absl::StrCat(
                                 NodeWhere(shard->work(), *shard->node, shard->device),
                                 ": dropped before it ran"));
  shard->work_done->Done(ended);  // Last: completing the work may free `shard`.
}

void Worker::RunHostWork(std::shared_ptr<const HostWork> work, Promise<> enqueued,
                         Promise<> done) {
  if (std::shared_ptr<const SegmentPlan> plan = PlanOf(*work)) {
    segment_works_.fetch_add(1, std::memory_order_relaxed);
    return DispatchSegments(std::move(work), std::move(plan), std::move(enqueued),
                            std::move(done));
  }
  auto d = std::make_shared<Dispatched>();
  Dispatching state;
  state.local.assign(work->buffers->size(), false);
  size_t num_shards = 0;
  for (size_t i = work->begin; i < work->end; ++i) {
    if (const auto* c = std::get_if<ComputeWork>(&work->program->nodes[i].work)) {
      num_shards += c->local_ranks.size();
      for (int v : c->release) state.local[v] = true;
    }
  }
  d->shards.reserve(num_shards);
  d->work = std::move(work);
  const std::shared_ptr<Countdown> transfers_done(d, &d->done);
  // Consecutive nodes of one function on one slice (a chain of steps) share the lookup.
  const ComputeWork* loaded_for = nullptr;
  absl::StatusOr<ExecutableRef> exe;
  for (size_t i = d->work->begin; i < d->work->end; ++i) {
    const NodeWork& node = d->work->program->nodes[i];
    if (const auto* c = std::get_if<ComputeWork>(&node.work)) {
      if (loaded_for == nullptr || c->function != loaded_for->function ||
          c->slice_devices != loaded_for->slice_devices) {
        exe = LoadExecutable(c->function, c->slice_devices);
        if (exe.ok()) d->executables.push_back(*exe);
        loaded_for = c;
      }
      DispatchCompute(d, state, node, *c, exe);
    } else {
      DispatchTransfer(*d->work, node, std::get<TransferWork>(node.work), transfers_done);
    }
  }
  state.EnqueueRest();
  for (auto& [key, h] : state.handoffs) d->unclaimed.push_back(std::move(h.memory));
  enqueued.Set();
  // The countdown's callback holds the work until its last part (a shard's end, a transfer or
  // this) completes it.
  d->done.future().OnReady(
      [done = std::move(done), d](const absl::Status& s) mutable { done.Set(s); });
  d->done.Done();  // Everything is added.
}

namespace {
// A shard that will never be produced: consumers see `error`.
ObjectStore::Shard FailedShard(const absl::Status& error) {
  return {Future<DeviceBufferRef>::Ready(error), Future<ReservationRef>::Ready(error), 0};
}
}  // namespace

void Worker::PutFailed(BufferId id, DeviceId device, const absl::Status& error) {
  store_.Put(id, device, FailedShard(error)).IgnoreError();
}

void Worker::DispatchCompute(const std::shared_ptr<Dispatched>& d, Dispatching& state,
                             const NodeWork& node, const ComputeWork& c,
                             const absl::StatusOr<ExecutableRef>& exe) {
  const HostWork* const work = d->work.get();
  Countdown* const done = &d->done;
  for (int rank : c.local_ranks) {
    const DeviceId device_id = c.slice_devices[rank];
    Device* device = FindDevice(device_id);
    absl::Status setup = exe.status();
    if (setup.ok() && device == nullptr)
      setup = absl::InternalError(absl::StrCat(device_id.ToString(), " is not on ", host_.ToString()));
    // Inputs: futures of shards already in (or promised to) this host's store.
    decltype(Shard::inputs) inputs;
    for (int in : c.inputs) {
      if (!setup.ok()) break;
      if (auto h = state.handoffs.find(std::make_pair(in, device_id));
          h != state.handoffs.end()) {
        setup = FailedAlready(h->second.buffer);
        inputs.push_back(h->second.buffer);
        continue;
      }
      auto f = store_.Get(work->buffer(in), device_id);
      if (!f.ok()) {
        setup = f.status();
        break;
      }
      setup = FailedAlready(*f);
      inputs.push_back(*std::move(f));
    }
    // An output goes to the store, or is handed on to its readers in this work.
    auto publish = [&](int k, ObjectStore::Shard h) -> absl::Status {
      const int v = c.outputs[k];
      if (!state.local[v]) return store_.Put(work->buffer(v), device_id, std::move(h));
      if (state.handoffs.try_emplace(std::make_pair(v, device_id), std::move(h)).second)
        return absl::OkStatus();
      return absl::AlreadyExistsError(absl::StrCat(
          work->buffer(v).ToString(), " already has a shard on ", device_id.ToString()));
    };
    auto publish_failed = [&](int k, const absl::Status& error) {
      publish(k, {FailedShard(error)}).IgnoreError();
    };
    // Outputs: reserve memory now; each shard is a promise until the computation runs.
    decltype(Shard::outputs) outputs;
    decltype(Shard::memory) memory;
    for (size_t k = 0; k < c.outputs.size(); ++k) {
      if (!setup.ok()) break;
      int64_t bytes = (*exe)->output_specs()[k].size_bytes();
      Promise<DeviceBufferRef> p;
      ObjectStore::Shard h{p.future(), {}, bytes};
      const BufferId out = work->buffer(c.outputs[k]);
      // Granted memory is held by the store entry (or hand-off); the device waits only for the
      // rest.
      Future<ReservationRef> pending;
      h.memory = ReserveMemory(*device, bytes, &pending);
      setup = publish(k, std::move(h));
      if (pending.valid()) {
        if (setup.ok()) setup = FailedAlready(pending);
        memory.push_back(std::move(pending));
      }
      if (!setup.ok()) setup = Annotate(setup, absl::StrCat(out.ToString(), " (output ", k, ")"));
      outputs.push_back(std::move(p));
    }
    if (!setup.ok() && exe.ok() && device != nullptr && !(*exe)->shards_skippable()) {
      // An SPMD partition: the device still runs it, as a stand-in on zeros (see below), so its
      // peers are not left inside XLA's collectives.
      for (size_t k = outputs.size(); k < c.outputs.size(); ++k) publish_failed(k, setup);
      inputs.assign({Future<DeviceBufferRef>::Ready(setup)});
    } else if (!setup.ok()) {
      absl::Status error = Annotate(setup, NodeWhere(*work, node, device_id));
      collectives_->FailLaunch(work->run.value(), node.node, error, c.slice_devices);
      for (auto& p : outputs) p.Set(error);
      for (size_t k = outputs.size(); k < c.outputs.size(); ++k) publish_failed(k, error);
      done->Add();
      done->Done(error);
      continue;
    }
    // What this node reads last: handed-on memory goes with the shard, store entries are
    // deleted once it has run.
    decltype(Shard::last_read) last_read;
    decltype(Shard::release) release;
    for (int v : c.release) {
      auto h = state.handoffs.find(std::make_pair(v, device_id));
      if (h == state.handoffs.end()) {
        release.push_back(work->buffer(v));
      } else {
        last_read.push_back(std::move(h->second.memory));
        state.handoffs.erase(h);
      }
    }
    done->Add();
    PW_CHECK(d->shards.size() < d->shards.capacity(), "more shards than counted");
    ShardPtr shard(&d->shards.emplace_back(Shard{.host_work = work,
                                                 .work_done = done,
                                                 .node = &node,
                                                 .exe = exe->get(),
                                                 .rank = rank,
                                                 .device = device_id,
                                                 .inputs = std::move(inputs),
                                                 .memory = std::move(memory),
                                                 .outputs = std::move(outputs),
                                                 .last_read = std::move(last_read),
                                                 .release = std::move(release)}));
    // The device waits for inputs and memory itself, like a stream waiting on events.
    state.Enqueue(device, [this, device, run = work->run,
                           shard = std::move(shard)](const absl::Status& health) mutable {
      device->SetCurrentRun(run.value());
      RunShard(std::move(shard), health);
    });
  }
}

void Worker::RunShard(ShardPtr shard, absl::Status s) {
  const HostWork& work = shard->work();
  const Executable& exe = *shard->exe;
  // A cancelled run's shard fails before waiting for memory or inputs (unless its shards cannot
  // be skipped one by one: then cancellation leaves it alone).
  const bool skippable = exe.shards_skippable();
  if (s.ok() && skippable) s = Cancelled(work.run);
  for (size_t k = 0; s.ok() && k < shard->memory.size(); ++k) {
    if (skippable) s = AwaitUnlessCancelled(shard->memory[k], work.run);
    if (s.ok()) s = shard->memory[k].status();
  }
  // The store entries hold the reservations from here on; dropping ours now means the memory is
  // free as soon as the run deletes its buffers, not when the shard is done.
  shard->memory.clear();
  ShardLaunch launch;
  launch.inputs.reserve(shard->inputs.size());
  for (size_t j = 0; s.ok() && j < shard->inputs.size(); ++j) {
    if (skippable && !(s = AwaitUnlessCancelled(shard->inputs[j], work.run)).ok()) break;
    const absl::StatusOr<DeviceBufferRef>& v = shard->inputs[j].Await();
    if (v.ok()) {
      launch.inputs.push_back(*v);
    } else {
      s = v.status();
    }
  }
  shard->inputs.clear();
  if (s.ok() && skippable) s = Cancelled(work.run);
  if (!s.ok() && skippable) return FailShard(std::move(shard), s);
  if (!s.ok()) {
    // An SPMD partition whose inputs or memory failed, or whose device was removed, still has
    // peers that launched, and they wait inside the backend's collectives, which the runtime
    // cannot abort: it runs on zeros as a stand-in so they complete. The launch is marked failed
    // first, and partitions of a failed launch fail their outputs instead of handing them on.
    collectives_->FailLaunch(work.run.value(), shard->node->node,
                             Annotate(s, NodeWhere(work, *shard->node, shard->device)),
                             shard->compute().slice_devices);
    launch.inputs.clear();
    for (const ArraySpec& spec : exe.input_specs()) {
      auto zeros = HostDeviceBuffer::Create(spec, shard->device);
      std::memset(zeros->mutable_data(), 0, spec.size_bytes());
      launch.inputs.push_back(std::move(zeros));
    }
    shard->failed = s;
  }
  launch.key = {work.run.value(), shard->node->node, 0};
  launch.rank = shard->rank;
  launch.slice_devices = shard->compute().slice_devices;
  launch.device = shard->device;
  launch.collectives = collectives_;
  // Native kernels complete before returning (then the shard finishes here, with no callback); a
  // backend with its own streams (PJRT) hands its output buffers on once the computation is
  // enqueued, and the device moves on to its next item meanwhile. The shard is done when the
  // computation has run.
  Executable::Run run = exe.Launch(launch);
  if (run.ran.has_value()) return OnShardOutputs(std::move(shard), *run.ran, Future<>());
  if (run.outputs.IsReady())
    return OnShardOutputs(std::move(shard), run.outputs.Await(), std::move(run.computed));
  CountInFlight(*shard);
  run.outputs.OnReady([this, shard = std::move(shard), computed = std::move(run.computed)](
                          const absl::StatusOr<std::vector<DeviceBufferRef>>& r) mutable {
    OnShardOutputs(std::move(shard), r, std::move(computed));
  });
}

void Worker::CountInFlight(Shard& shard) {
  if (shard.in_flight) return;
  shard.in_flight = true;
  in_flight_.count.fetch_add(1, std::memory_order_relaxed);
}

void Worker::OnShardOutputs(ShardPtr shard,
                            const absl::StatusOr<std::vector<DeviceBufferRef>>& r,
                            Future<> computed) {
  if (!r.ok()) {
    shard->failed = r.status();
  } else if (shard->failed.ok() && shard->exe->shards_skippable()) {
    for (size_t k = 0; k < shard->outputs.size(); ++k) shard->outputs[k].Set((*r)[k]);
    shard->outputs.clear();
  } else if (shard->failed.ok()) {
    shard->held = *r;  // Until the launch is known to be whole.
  }
  if (!computed.valid()) return OnShardComputed(std::move(shard), r.status());  // It ran.
  if (computed.IsReady()) return OnShardComputed(std::move(shard), computed.status());
  CountInFlight(*shard);
  computed.OnReady([this, shard = std::move(shard)](const absl::Status& s) mutable {
    OnShardComputed(std::move(shard), s);
  });
}

void Worker::OnShardComputed(ShardPtr shard, absl::Status s) {
  const bool in_flight = shard->in_flight;
  // A failed shard (a stand-in's too) fails its outputs once it has run: its peers needed it to.
  if (!shard->failed.ok()) s = shard->failed;
  else if (s.ok() && !shard->exe->shards_skippable())
    s = collectives_->LaunchFailure(shard->work().run.value(), shard->node->node);
  if (!s.ok()) {
    FailShard(std::move(shard), s);
  } else {
    for (size_t k = 0; k < shard->held.size(); ++k) shard->outputs[k].Set(shard->held[k]);
    // Intermediates this node read last: this device's shard can go now.
    for (BufferId b : shard->release) store_.DeleteShard(b, shard->device);
    shard->ended = absl::OkStatus();
    shard.reset();
  }
  if (in_flight) in_flight_.count.fetch_sub(1, std::memory_order_release);  // The last use.
}

void Worker::FailShard(ShardPtr shard, const absl::Status& status) {
  const absl::Status error =
      Annotate(status, NodeWhere(shard->work(), *shard->node, shard->device));
  // Other shards may be waiting in a collective this shard will never reach.
  collectives_->FailLaunch(shard->work().run.value(), shard->node->node, error,
                           shard->compute().slice_devices);
  for (auto& p : shard->outputs) p.Set(error);
  // A failed shard's outputs hold no memory (a cancelled run's must not keep its devices full).
  for (int v : shard->compute().outputs) store_.DropMemory(shard->work().buffer(v), shard->device);
  shard->ended = error;  // The caller's ShardPtr ends it.
}

void Worker::DispatchTransfer(const HostWork& work, const NodeWork& node, const TransferWork& t,
                              const std::shared_ptr<Countdown>& done) {
  const ArraySpec shard_spec{t.global.dtype, t.dst_sharding.ShardShape(t.global.shape)};
  const size_t esize = DTypeSize(t.global.dtype);
  for (int rank : t.local_ranks) {
    const DeviceId device_id = t.dst_devices[rank];
    const std::string where = NodeWhere(work, node, device_id);
    Device* device = FindDevice(device_id);
    if (device == nullptr) {
      absl::Status error = absl::InternalError(
          absl::StrCat(where, ": ", device_id.ToString(), " is not on ", host_.ToString()));
      PutFailed(work.buffer(t.dst), device_id, error);
      done->Add();
      done->Done(error);
      continue;
    }
    const Box dst_box = t.dst_sharding.ShardBox(t.global.shape, rank);
    // One source per distinct source region overlapping ours: same device, then same host.
    struct Source {
      Box box;
      int rank;
      int score;
    };
    std::vector<Source> sources;
    for (int s = 0; s < static_cast<int>(t.src_devices.size()); ++s) {
      Box box = t.src_sharding.ShardBox(t.global.shape, s);
      Box overlap;
      for (size_t d = 0; d < box.start.size(); ++d) {
        overlap.start.push_back(std::max(box.start[d], dst_box.start[d]));
        overlap.limit.push_back(std::min(box.limit[d], dst_box.limit[d]));
      }
      if (overlap.num_elements() == 0) continue;
      int score = t.src_devices[s] == device_id ? 0 : t.src_hosts[s] == host_ ? 1 : 2;
      auto it = std::find_if(sources.begin(), sources.end(),
                             [&](const Source& x) { return x.box == box; });
      if (it == sources.end()) {
        sources.push_back({box, s, score});
      } else if (score < it->score) {
        *it = {box, s, score};
      }
    }
    std::vector<Future<DeviceBufferRef>> fetched;
    std::vector<Future<>> deps;
    for (const Source& s : sources) {
      WorkerInterface* peer = t.src_hosts[s.rank] == host_ ? this : peers_(t.src_hosts[s.rank]);
      Future<DeviceBufferRef> f =
          peer == nullptr ? Future<DeviceBufferRef>::Ready(absl::UnavailableError(absl::StrCat(
                                t.src_hosts[s.rank].ToString(), " is unreachable")))
                          : peer->FetchShard(work.buffer(t.src), t.src_devices[s.rank]);
      deps.push_back(AsStatusFuture(f));
      fetched.push_back(std::move(f));
    }
    const int64_t bytes = shard_spec.size_bytes();
    auto mem = device->memory().Reserve(bytes);
    deps.push_back(AsStatusFuture(mem));
    Promise<DeviceBufferRef> out;
    done->Add();
    std::shared_ptr<Countdown> shard_done = done;
    absl::Status put = store_.Put(work.buffer(t.dst), device_id, {out.future(), mem, bytes});
    if (!put.ok()) {
      out.Set(Annotate(put, where));
      shard_done->Done(Annotate(put, where));
      continue;
    }
    std::vector<int> src_ranks;
    for (const Source& s : sources) src_ranks.push_back(s.rank);
    JoinFutures(deps).OnReady([this, run = work.run, t, src_ranks, fetched = std::move(fetched),
                               dst_box, shard_spec, device_id, esize, where, out = std::move(out),
                               shard_done](const absl::Status& s) mutable {
      if (!s.ok()) {
        out.Set(Annotate(s, where));
        shard_done->Done(Annotate(s, where));
        return;
      }
      data_plane_.Post([this, run, t = std::move(t), src_ranks = std::move(src_ranks),
                        fetched = std::move(fetched), dst_box, shard_spec, device_id, esize, where,
                        out = std::move(out), shard_done]() mutable {
        if (absl::Status c = Cancelled(run); !c.ok()) {
          out.Set(Annotate(c, where));
          shard_done->Done(Annotate(c, where));
          return;
        }
        auto dst = HostDeviceBuffer::Create(shard_spec, device_id);
        int64_t copied = 0;
        for (size_t i = 0; i < fetched.size(); ++i) {
          const DeviceBufferRef& src = *fetched[i].Await();
          const Box src_box = t.src_sharding.ShardBox(t.global.shape, src_ranks[i]);
          const HostDeviceBuffer* host_src = src->AsHost();
          std::vector<uint8_t> staged;
          const void* data = host_src ? host_src->data() : nullptr;
          if (data == nullptr) {
            staged.resize(src->size_bytes());
            absl::Status c = src->CopyToHost(staged.data()).status();
            if (!c.ok()) {
              out.Set(Annotate(c, where));
              shard_done->Done(Annotate(c, where));
              return;
            }
            data = staged.data();
          }
          copied += CopyBoxIntersection(data, src_box, dst->mutable_data(), dst_box, esize) *
                    static_cast<int64_t>(esize);
        }
        CountReceived(t.link, copied);
        out.Set(DeviceBufferRef(std::move(dst)));
        shard_done->Done();
      });
    });
  }
}

Future<> Worker::PutShard(BufferId id, DeviceId device_id, HostArray shard) {
  Device* device = FindDevice(device_id);
  if (device == nullptr)
    return Future<>::Ready(absl::NotFoundError(
        absl::StrCat(device_id.ToString(), " is not on ", host_.ToString())));
  absl::Status health = device->health();
  if (!health.ok()) return Future<>::Ready(health);
  const int64_t bytes = shard.spec.size_bytes();
  auto mem = device->memory().Reserve(bytes);
  Promise<DeviceBufferRef> p;
  Future<DeviceBufferRef> f = p.future();
  if (absl::Status s = store_.Put(id, device_id, {f, mem, bytes}); !s.ok()) return Future<>::Ready(s);
  mem.OnReady([p = std::move(p), shard = std::move(shard),
               device_id](const absl::StatusOr<ReservationRef>& r) mutable {
    if (!r.ok()) return p.Set(r.status());
    p.Set(DeviceBufferRef(HostDeviceBuffer::FromHost(shard.spec, device_id, shard.bytes.data())));
  });
  return AsStatusFuture(f);
}

Future<DeviceBufferRef> Worker::FetchShard(BufferId id, DeviceId device) {
  if (FindDevice(device) == nullptr)
    return Future<DeviceBufferRef>::Ready(absl::NotFoundError(
        absl::StrCat(device.ToString(), " is not on ", host_.ToString())));
  return store_.GetWhenCreated(id, device);
}

void Worker::DeleteBuffers(const std::vector<BufferId>& ids) {
  store_.DeleteMany(ids);
}

void Worker::CancelRuns(const std::vector<RunId>& runs, const absl::Status& reason) {
  {
    const absl::Time now = absl::Now();
    pw::MutexLock lock(&cancel_mu_);
    for (RunId r : runs) cancelled_.try_emplace(r, CancelledRun{reason, now});
    num_cancelled_.store(cancelled_.size(), std::memory_order_release);
  }
  // Shards of the runs waiting in collectives (for peers that will not come) fail now.
  for (RunId r : runs) collectives_->CancelRun(r.value(), reason);
}

std::vector<Worker::Overrun> Worker::Overrunning(absl::Time now, absl::Duration grace) const {
  std::vector<Overrun> out;
  if (num_cancelled_.load(std::memory_order_acquire) == 0) return out;
  pw::MutexLock lock(&cancel_mu_);
  for (const auto& [id, device] : devices_) {
    const int64_t run = device->current_run();
    if (run < 0) continue;
    auto it = cancelled_.find(RunId(run));
    if (it == cancelled_.end() || now - it->second.at <= grace) continue;
    out.push_back({id, RunId(run), now - it->second.at, it->second.why});
  }
  std::sort(out.begin(), out.end(),
            [](const Overrun& a, const Overrun& b) { return a.device < b.device; });
  return out;
}

void Worker::ForgetRuns(const std::vector<RunId>& runs) {
  for (RunId r : runs) collectives_->ForgetRun(r.value());
  pw::MutexLock lock(&cancel_mu_);
  for (RunId r : runs) cancelled_.erase(r);
  num_cancelled_.store(cancelled_.size(), std::memory_order_release);
}

absl::Status Worker::Cancelled(RunId run) {
  if (num_cancelled_.load(std::memory_order_acquire) == 0) return absl::OkStatus();
  pw::MutexLock lock(&cancel_mu_);
  auto it = cancelled_.find(run);
  if (it == cancelled_.end()) return absl::OkStatus();
  cancelled_shards_.fetch_add(1, std::memory_order_relaxed);
  return it->second.why;
}

absl::Status Worker::RemoveDevice(DeviceId device_id, const absl::Status& reason) {
  // Another host's device: only this host's collectives that include it are aborted.
  if (Device* device = FindDevice(device_id); device != nullptr) device->Remove(reason);
  collectives_->AbortDevice(device_id, reason);
  return absl::OkStatus();
}

absl::Status Worker::RestoreDevice(DeviceId device_id) {
  if (FindDevice(device_id) != nullptr)
    return absl::FailedPreconditionError(
        absl::StrCat(device_id.ToString(), " of ", host_.ToString(), " cannot come back in this "
                     "process; restart the worker"));
  collectives_->RestoreDevice(device_id);
  return absl::OkStatus();
}

absl::StatusOr<HostStatus> Worker::Status() const {
  HostStatus s;
  s.host = host_;
  s.island = island_;
  for (const auto& [id, d] : devices_) {
    s.devices.push_back({id, host_, island_, d->health().ok(), d->memory().capacity(),
                         d->memory().in_use(), d->memory().waiting(), d->queue_depth(),
                         d->executed()});
  }
  std::sort(s.devices.begin(), s.devices.end(),
            [](const DeviceStatus& a, const DeviceStatus& b) { return a.id < b.id; });
  s.buffers = store_.num_buffers();
  s.buffer_bytes = store_.bytes();
  s.ici_bytes_received = ici_bytes_.load();
  s.dcn_bytes_received = dcn_bytes_.load();
  s.dispatch_queue_depth = dispatch_.depth();
  s.cancelled_shards = static_cast<size_t>(cancelled_shards_.load());
  return s;
}

}  // namespace pw
