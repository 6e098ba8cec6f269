// Segments: a work's shards on one device run as one queue item (see worker.h).
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/worker/worker.h"

namespace pw {

struct Worker::SegmentPlan {
  std::weak_ptr<const HostProgram> program;  // Planned for (the steps point into it).
  bool usable = false;  // Else the work takes the shard-by-shard path.
  std::vector<ExecutableRef> executables;    // What the steps' `exe` point to.
  // One compute node's shard on the device. A value is a slot of the segment (>= 0): an
  // intermediate that only later steps of the segment read; or (< 0) ~i, the segment's i-th
  // input or output, in the store.
  struct Step {
    const NodeWork* node;
    const ComputeWork* compute;
    const Executable* exe;
    int rank;
    absl::InlinedVector<int, 2> inputs;
    absl::InlinedVector<bool, 2> take;  // The slot's last read: its value is moved out.
    absl::InlinedVector<int, 2> outputs;
    absl::InlinedVector<int, 1> drop;        // Slots the node releases: emptied after it.
    absl::InlinedVector<int, 1> release;     // Store values it reads last: deleted after it.
  };
  struct OnDevice {
    Device* device;
    std::vector<Step> steps;
    int slots = 0;
    std::vector<int> input_values;  // By input: the value index.
    struct Output {
      int value;
      int64_t bytes;
    };
    std::vector<Output> outputs;
    int64_t scratch_bytes = 0;  // The most bytes the slots hold at once.
  };
  std::vector<OnDevice> devices;
  // The work's nodes in order: a transfer (step < 0) or a compute node's shard on a device.
  struct Action {
    const NodeWork* node;
    int device = -1;
    int step = -1;
  };
  std::vector<Action> order;
};

struct Worker::Segment {
  const HostWork* work;  // Held with the plan until the work's countdown completes.
  Countdown* done;
  const SegmentPlan::OnDevice* plan;
  std::vector<Future<DeviceBufferRef>> inputs;
  std::vector<Promise<DeviceBufferRef>> outputs;
  std::vector<Future<ReservationRef>> output_memory;  // Invalid where granted at dispatch.
  ObjectStore::Memory scratch;
  std::vector<std::pair<int, absl::Status>> setup_errors;  // By step, in step order.
  absl::Status first_error;
  bool ran = false;
};

void Worker::SegmentEnd::operator()(Segment* segment) const {
  absl::Status ended = segment->ran ? segment->first_error
                                    : absl::CancelledError(absl::StrCat(
                                          segment->work->run.ToString(), " on ",
                                          segment->plan->device->id().ToString(),
                                          ": segment dropped before it ran"));
  Countdown* done = segment->done;
  delete segment;  // Its unset promises fail their futures.
  done->Done(ended);
}

std::shared_ptr<const Worker::SegmentPlan> Worker::PlanOf(const HostWork& work) {
  const PlanKey key{work.program.get(), work.begin, work.end};
  auto it = plans_.find(key);
  if (it != plans_.end() && it->second->program.lock() != work.program) {
    plans_.erase(it);  // A program at the address of one that has gone.
    it = plans_.end();
  }
  if (it == plans_.end()) {
    if (plans_.size() >= 4096) {
      absl::erase_if(plans_, [](const auto& kv) { return kv.second->program.expired(); });
      if (plans_.size() >= 4096) plans_.clear();
    }
    it = plans_.emplace(key, MakePlan(work)).first;
  }
  return it->second->usable ? it->second : nullptr;
}

std::shared_ptr<const Worker::SegmentPlan> Worker::MakePlan(const HostWork& work) {
  auto plan = std::make_shared<SegmentPlan>();
  plan->program = work.program;
  // Anything unusual takes the shard-by-shard path, which reports it.
  auto unusable = std::make_shared<SegmentPlan>();
  unusable->program = work.program;
  const auto& nodes = work.program->nodes;
  // Values read last by a node of the work: the rest are read outside it (or kept).
  std::vector<bool> local(work.buffers->size(), false);
  for (size_t i = work.begin; i < work.end; ++i)
    if (const auto* c = std::get_if<ComputeWork>(&nodes[i].work))
      for (int v : c->release)
        if (v >= 0 && v < static_cast<int>(local.size())) local[v] = true;
  absl::flat_hash_map<DeviceId, int> device_index;
  // Each device's slot of a value produced by an earlier step, with its bytes.
  absl::flat_hash_map<std::pair<int, DeviceId>, std::pair<int, int64_t>> slots;
  std::vector<int64_t> live;  // By device: bytes in slots now.
  for (size_t i = work.begin; i < work.end; ++i) {
    const NodeWork& node = nodes[i];
    const auto* c = std::get_if<ComputeWork>(&node.work);
    if (c == nullptr) {
      plan->order.push_back({&node});
      continue;
    }
    absl::StatusOr<ExecutableRef> exe = LoadExecutable(c->function, c->slice_devices);
    if (!exe.ok() || !(*exe)->shards_skippable() ||
        (*exe)->output_specs().size() != c->outputs.size())
      return unusable;
    plan->executables.push_back(*exe);
    for (int rank : c->local_ranks) {
      if (rank < 0 || rank >= static_cast<int>(c->slice_devices.size())) return unusable;
      const DeviceId id = c->slice_devices[rank];
      Device* device = FindDevice(id);
      if (device == nullptr) return unusable;
      auto [d, added] = device_index.try_emplace(id, static_cast<int>(plan->devices.size()));
      if (added) {
        plan->devices.push_back({device});
        live.push_back(0);
      }
      SegmentPlan::OnDevice& on = plan->devices[d->second];
      SegmentPlan::Step step{&node, c, exe->get(), rank};
      for (size_t j = 0; j < c->inputs.size(); ++j) {
        const int v = c->inputs[j];
        auto s = slots.find(std::make_pair(v, id));
        if (s == slots.end()) {
          step.inputs.push_back(~static_cast<int>(on.input_values.size()));
          step.take.push_back(false);
          on.input_values.push_back(v);
          continue;
        }
        // The last read of a value takes it: the node releases it and reads it no later.
        const bool last =
            std::find(c->release.begin(), c->release.end(), v) != c->release.end() &&
            std::find(c->inputs.begin() + j + 1, c->inputs.end(), v) == c->inputs.end();
        step.inputs.push_back(s->second.first);
        step.take.push_back(last);
      }
      for (size_t k = 0; k < c->outputs.size(); ++k) {
        const int v = c->outputs[k];
        if (v < 0 || v >= static_cast<int>(local.size())) return unusable;
        const int64_t bytes = (*exe)->output_specs()[k].size_bytes();
        if (!local[v]) {
          step.outputs.push_back(~static_cast<int>(on.outputs.size()));
          on.outputs.push_back({v, bytes});
          continue;
        }
        if (!slots.try_emplace(std::make_pair(v, id), on.slots, bytes).second) return unusable;
        step.outputs.push_back(on.slots++);
        live[d->second] += bytes;
      }
      on.scratch_bytes = std::max(on.scratch_bytes, live[d->second]);
      for (int v : c->release) {
        auto s = slots.find(std::make_pair(v, id));
        if (s == slots.end()) {
          step.release.push_back(v);
        } else {
          step.drop.push_back(s->second.first);
          live[d->second] -= s->second.second;
          slots.erase(s);
        }
      }
      plan->order.push_back({&node, d->second, static_cast<int>(on.steps.size())});
      on.steps.push_back(std::move(step));
    }
  }
  plan->usable = true;
  return plan;
}

void Worker::DispatchSegments(std::shared_ptr<const HostWork> work,
                              std::shared_ptr<const SegmentPlan> plan, Promise<> enqueued,
                              Promise<> done) {
  // Until every segment and transfer has ended: what they point into.
  struct Held {
    std::shared_ptr<const HostWork> work;
    std::shared_ptr<const SegmentPlan> plan;
    Countdown done;
  };
  auto d = std::make_shared<Held>();
  d->work = std::move(work);
  d->plan = std::move(plan);
  const HostWork& w = *d->work;
  const std::shared_ptr<Countdown> transfers_done(d, &d->done);
  std::vector<SegmentPtr> segments;
  for (const SegmentPlan::OnDevice& on : d->plan->devices) {
    SegmentPtr s(new Segment{.work = &w, .done = &d->done, .plan = &on});
    s->inputs.resize(on.input_values.size());
    s->outputs.resize(on.outputs.size());
    s->output_memory.resize(on.outputs.size());
    if (on.scratch_bytes > 0) s->scratch = ReserveMemory(*on.device, on.scratch_bytes, nullptr);
    d->done.Add();
    segments.push_back(std::move(s));
  }
  for (const SegmentPlan::Action& a : d->plan->order) {
    if (a.step < 0) {
      DispatchTransfer(w, *a.node, std::get<TransferWork>(a.node->work), transfers_done);
      continue;
    }
    Segment& s = *segments[a.device];
    const SegmentPlan::OnDevice& on = *s.plan;
    const SegmentPlan::Step& step = on.steps[a.step];
    const DeviceId device = on.device->id();
    for (int x : step.inputs) {
      if (x >= 0) continue;
      absl::StatusOr<Future<DeviceBufferRef>> f = store_.Get(w.buffer(on.input_values[~x]), device);
      s.inputs[~x] = f.ok() ? *std::move(f) : Future<DeviceBufferRef>::Ready(f.status());
    }
    for (size_t k = 0; k < step.outputs.size(); ++k) {
      const int y = step.outputs[k];
      if (y >= 0) continue;
      const SegmentPlan::OnDevice::Output& out = on.outputs[~y];
      ObjectStore::Memory memory = ReserveMemory(*on.device, out.bytes, &s.output_memory[~y]);
      const BufferId id = w.buffer(out.value);
      absl::Status put = store_.Put(id, device, {s.outputs[~y].future(), std::move(memory),
                                                 out.bytes});
      if (!put.ok())
        s.setup_errors.emplace_back(
            a.step, Annotate(put, absl::StrCat(id.ToString(), " (output ", k, ")")));
    }
  }
  for (SegmentPtr& s : segments) {
    Device* device = s->plan->device;
    device->Enqueue([this, device, s = std::move(s)](const absl::Status& health) mutable {
      device->SetCurrentRun(s->work->run.value());
      RunSegment(*s, health);
    });
  }
  enqueued.Set();
  d->done.future().OnReady(
      [done = std::move(done), d](const absl::Status& s) mutable { done.Set(s); });
  d->done.Done();  // Everything is added.
}

void Worker::RunSegment(Segment& seg, absl::Status health) {
  seg.ran = true;
  const HostWork& work = *seg.work;
  const SegmentPlan::OnDevice& plan = *seg.plan;
  Device& device = *plan.device;
  // The intermediates' memory, waited for by the first step that makes one.
  const auto* scratch = std::get_if<Future<ReservationRef>>(&seg.scratch);
  std::vector<absl::StatusOr<DeviceBufferRef>> slots(plan.slots, DeviceBufferRef());
  size_t next_setup_error = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const SegmentPlan::Step& step = plan.steps[i];
    // Why it does not run, if it does not: as a shard would (RunShard).
    absl::Status s = health.ok() ? device.removed() : health;
    if (s.ok()) s = Cancelled(work.run);
    if (s.ok() && scratch != nullptr &&
        std::any_of(step.outputs.begin(), step.outputs.end(), [](int y) { return y >= 0; })) {
      s = AwaitUnlessCancelled(*scratch, work.run);
      if (s.ok()) s = scratch->status();
    }
    for (; next_setup_error < seg.setup_errors.size() &&
           seg.setup_errors[next_setup_error].first == static_cast<int>(i);
         ++next_setup_error)
      if (s.ok()) s = seg.setup_errors[next_setup_error].second;
    // The store entries hold the outputs' memory: once granted, the segment needs it no more.
    for (int y : step.outputs) {
      if (y >= 0 || !seg.output_memory[~y].valid()) continue;
      if (s.ok()) s = AwaitUnlessCancelled(seg.output_memory[~y], work.run);
      if (s.ok()) s = seg.output_memory[~y].status();
      seg.output_memory[~y] = Future<ReservationRef>();
    }
    ShardLaunch launch;
    for (size_t j = 0; s.ok() && j < step.inputs.size(); ++j) {
      const int x = step.inputs[j];
      absl::StatusOr<DeviceBufferRef> v;
      if (x < 0) {
        if (absl::Status c = AwaitUnlessCancelled(seg.inputs[~x], work.run); !c.ok()) {
          s = c;
          break;
        }
        v = seg.inputs[~x].Await();
      } else if (slots[x].ok() && *slots[x] == nullptr) {
        v = absl::InternalError(absl::StrCat("an input of ", step.node->name, " on ",
                                             device.id().ToString(),
                                             " was taken by an earlier read"));
      } else {
        v = step.take[j] ? std::move(slots[x]) : slots[x];
        if (step.take[j]) slots[x] = DeviceBufferRef();
      }
      if (v.ok()) {
        launch.inputs.push_back(*std::move(v));
      } else {
        s = v.status();
      }
    }
    if (s.ok()) s = Cancelled(work.run);
    std::optional<absl::StatusOr<std::vector<DeviceBufferRef>>> ran;
    if (s.ok()) {
      launch.key = {work.run.value(), step.node->node, 0};
      launch.rank = step.rank;
      launch.slice_devices = step.compute->slice_devices;
      launch.device = device.id();
      launch.collectives = collectives_;
      Executable::Run run = step.exe->Launch(launch);
      ran = std::move(run.ran);
      if (!ran.has_value()) {
        // A backend with its own streams (PJRT) hands back futures: the step completes through
        // its event, on the device thread, as native kernels complete inline (a later step may
        // read its outputs from a slot).
        const absl::Status computed = run.computed.valid() ? run.computed.status()
                                                           : absl::OkStatus();
        ran = computed.ok() ? run.outputs.Await()
                            : absl::StatusOr<std::vector<DeviceBufferRef>>(computed);
      }
      if (!ran->ok()) s = ran->status();
      else if ((*ran)->size() != step.outputs.size())
        s = absl::InternalError(absl::StrCat((*ran)->size(), " outputs, expected ",
                                             step.outputs.size()));
    }
    launch.inputs.clear();
    if (!s.ok()) {
      // Its peers may wait in a collective this shard will not reach; readers get the error.
      const absl::Status error = Annotate(s, NodeWhere(work, *step.node, device.id()));
      collectives_->FailLaunch(work.run.value(), step.node->node, error,
                               step.compute->slice_devices);
      for (int y : step.outputs) {
        if (y >= 0) {
          slots[y] = error;
        } else {
          seg.outputs[~y].Set(error);
          // A failed output holds no memory (a cancelled run's must not keep its device full).
          store_.DropMemory(work.buffer(plan.outputs[~y].value), device.id());
        }
      }
      if (seg.first_error.ok()) seg.first_error = error;
    } else {
      for (size_t k = 0; k < step.outputs.size(); ++k) {
        const int y = step.outputs[k];
        if (y >= 0) slots[y] = std::move((**ran)[k]);
        else seg.outputs[~y].Set(std::move((**ran)[k]));
      }
      for (int v : step.release) store_.DeleteShard(work.buffer(v), device.id());
    }
    for (int x : step.drop) slots[x] = DeviceBufferRef();
  }
  device.CountExecuted(static_cast<int64_t>(plan.steps.size()) - 1);
}

}  // namespace pw
