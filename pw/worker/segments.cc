// Segments: a work's shards on one device run as one queue item (see worker.h); the one path of
// every work, whatever its backends.
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/trace/trace.h"
#include "pw/worker/worker.h"

namespace pw {

struct Worker::SegmentPlan {
  std::weak_ptr<const HostProgram> program;  // Planned for (the steps point into it).
  absl::Status malformed;  // A work no plan can run (it names the node): it fails whole.
  // One compute node's shard on the device. A value is a slot of the segment (>= 0): an
  // intermediate that only later steps of the segment read; or (< 0) ~i, the segment's i-th
  // input or output, in the store.
  struct Step {
    const NodeWork* node;
    const ComputeWork* compute;
    Future<ExecutableRef> exe;  // Compiled (or compiling) for the node's slice.
    // Why it cannot run (its function is unknown, its intermediate values cannot fit), if so.
    absl::Status invalid;
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
  // Shards the work assigns to devices this host does not have: their outputs are stored failed.
  struct Misplaced {
    const ComputeWork* compute;
    DeviceId device;
    absl::Status error;
  };
  std::vector<Misplaced> misplaced;
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
  std::atomic<int64_t>* device_ns;  // The work's device time, summed over its segments.
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
    num_plans_.store(plans_.size(), std::memory_order_relaxed);
  }
  return it->second;
}

void Worker::DropPlans(const absl::flat_hash_set<uint64_t>& programs) {
  absl::erase_if(plans_, [&](const auto& kv) {
    std::shared_ptr<const HostProgram> p = kv.second->program.lock();
    return p == nullptr || programs.contains(p->id);
  });
  num_plans_.store(plans_.size(), std::memory_order_relaxed);
}

std::shared_ptr<const Worker::SegmentPlan> Worker::MakePlan(const HostWork& work) {
  auto plan = std::make_shared<SegmentPlan>();
  plan->program = work.program;
  auto malformed = [&](const NodeWork& node, absl::string_view what) {
    auto bad = std::make_shared<SegmentPlan>();
    bad->program = work.program;
    bad->malformed = absl::InvalidArgumentError(absl::StrCat(
        work.run.ToString(), " program '", work.program->program, "' node '", node.name, "': ",
        what));
    return bad;
  };
  const auto& nodes = work.program->nodes;
  const int num_values = static_cast<int>(work.buffers->size());
  // Values read last by a node of the work: the rest are read outside it (or kept).
  std::vector<bool> local(num_values, false);
  for (size_t i = work.begin; i < work.end; ++i)
    if (const auto* c = std::get_if<ComputeWork>(&nodes[i].work))
      for (int v : c->release)
        if (v >= 0 && v < num_values) local[v] = true;
  absl::flat_hash_map<DeviceId, int> device_index;
  // Each device's slot of a value produced by an earlier step, with its bytes.
  absl::flat_hash_map<std::pair<int, DeviceId>, std::pair<int, int64_t>> slots;
  std::vector<int64_t> live;  // By device: bytes in slots now.
  // Consecutive nodes of one function on one slice (a chain of steps) share the lookup.
  const ComputeWork* loaded_for = nullptr;
  absl::StatusOr<Loaded> loaded;
  for (size_t i = work.begin; i < work.end; ++i) {
    const NodeWork& node = nodes[i];
    const auto* c = std::get_if<ComputeWork>(&node.work);
    if (c == nullptr) {
      plan->order.push_back({&node});
      continue;
    }
    if (loaded_for == nullptr || c->function != loaded_for->function ||
        *c->slice_devices != *loaded_for->slice_devices) {
      loaded = LoadExecutable(c->function, *c->slice_devices);
      loaded_for = c;
    }
    absl::Status invalid = loaded.status();
    if (invalid.ok() && loaded->outputs.size() != c->outputs.size())
      invalid = absl::InternalError(absl::StrCat("the node has ", c->outputs.size(),
                                                 " outputs but its function ",
                                                 loaded->outputs.size()));
    for (int v : c->inputs)
      if (v < 0 || v >= num_values) return malformed(node, absl::StrCat("input value ", v));
    for (int v : c->outputs)
      if (v < 0 || v >= num_values) return malformed(node, absl::StrCat("output value ", v));
    for (int v : c->release)
      if (v < 0 || v >= num_values) return malformed(node, absl::StrCat("released value ", v));
    for (int rank : c->local_ranks) {
      if (rank < 0 || rank >= static_cast<int>(c->slice_devices->size()))
        return malformed(node, absl::StrCat("rank ", rank, " of a slice of ",
                                            c->slice_devices->size()));
      const DeviceId id = (*c->slice_devices)[rank];
      Device* device = FindDevice(id);
      if (device == nullptr) {
        plan->misplaced.push_back({c, id, absl::InternalError(absl::StrCat(
                                              NodeWhere(work, node, id), ": ", id.ToString(),
                                              " is not on ", host_.ToString()))});
        continue;
      }
      auto [d, added] = device_index.try_emplace(id, static_cast<int>(plan->devices.size()));
      if (added) {
        plan->devices.push_back({device});
        live.push_back(0);
      }
      SegmentPlan::OnDevice& on = plan->devices[d->second];
      SegmentPlan::Step step{&node, c, loaded.ok() ? loaded->exe : Future<ExecutableRef>(),
                             invalid, rank};
      // A shard's intermediate values are allocated as it runs, outside the device's budget
      // (as an accelerator compiler's temporaries are), but never more than the device has:
      // the controller refuses such a function at binding, and a worker does not try.
      if (step.invalid.ok() && loaded->temp_bytes > device->memory().capacity())
        step.invalid = absl::ResourceExhaustedError(absl::StrCat(
            NodeWhere(work, node, id), ": its intermediate values need ", loaded->temp_bytes,
            " bytes, but ", id.ToString(), " has only ", device->memory().capacity(),
            " bytes of memory in all; it can never run there"));
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
        const int64_t bytes =
            loaded.ok() && k < loaded->outputs.size() ? loaded->outputs[k].size_bytes() : 0;
        if (!local[v]) {
          step.outputs.push_back(~static_cast<int>(on.outputs.size()));
          on.outputs.push_back({v, bytes});
          continue;
        }
        if (!slots.try_emplace(std::make_pair(v, id), on.slots, bytes).second)
          return malformed(node, absl::StrCat("value ", v, " is produced twice on ",
                                              id.ToString()));
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
  return plan;
}

void Worker::DispatchSegments(std::shared_ptr<const HostWork> work, Promise<absl::Time> enqueued,
                              Promise<int64_t> done) {
  std::shared_ptr<const SegmentPlan> plan = PlanOf(*work);
  trace::Span span(trace::HostTrack(host_), "dispatch", work->program->program,
                   work->client.value());
  if (span.active()) {
    const int64_t run = work->run.value(), begin = static_cast<int64_t>(work->begin);
    span.Arg("run", run).Arg("program", work->program->program);
    span.Arg("nodes", static_cast<int64_t>(work->end - work->begin));
    span.FlowIn(trace::FlowId(run, trace::Stage::kDispatch, host_.value(), begin));
    for (const SegmentPlan::OnDevice& on : plan->devices)
      span.FlowOut(trace::FlowId(run, trace::Stage::kCompute, on.device->id().value(), begin));
    for (const SegmentPlan::Action& a : plan->order) {
      if (a.step >= 0) continue;
      const TransferWork& t = std::get<TransferWork>(a.node->work);
      for (int rank : t.local_ranks)
        if (rank >= 0 && rank < static_cast<int>(t.dst_devices.size()))
          span.FlowOut(trace::FlowId(run, trace::Stage::kTransfer, a.node->node,
                                     t.dst_devices[rank].value()));
    }
  }
  if (!plan->malformed.ok()) {
    enqueued.Set(absl::Now());
    return done.Set(plan->malformed);
  }
  // Until every segment and transfer has ended: what they point into.
  struct Held {
    std::shared_ptr<const HostWork> work;
    std::shared_ptr<const SegmentPlan> plan;
    Countdown done;
    std::atomic<int64_t> device_ns{0};
  };
  auto d = std::make_shared<Held>();
  d->work = std::move(work);
  d->plan = std::move(plan);
  const HostWork& w = *d->work;
  const std::shared_ptr<Countdown> transfers_done(d, &d->done);
  for (const SegmentPlan::Misplaced& m : d->plan->misplaced) {
    for (int v : m.compute->outputs) PutFailed(w.buffer(v), m.device, m.error);
    d->done.Add();
    d->done.Done(m.error);
  }
  std::vector<SegmentPtr> segments;
  for (const SegmentPlan::OnDevice& on : d->plan->devices) {
    SegmentPtr s(new Segment{.work = &w, .done = &d->done, .device_ns = &d->device_ns, .plan = &on});
    s->inputs.resize(on.input_values.size());
    s->outputs.resize(on.outputs.size());
    s->output_memory.resize(on.outputs.size());
    if (on.scratch_bytes > 0) s->scratch = ReserveMemory(*on.device, on.scratch_bytes, nullptr);
    d->done.Add();
    segments.push_back(std::move(s));
  }
  for (const SegmentPlan::Action& a : d->plan->order) {
    if (a.step < 0) {
      DispatchTransfer(w, *a.node, std::get<TransferWork>(a.node->work), transfers_done,
                       span.active());
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
  enqueued.Set(absl::Now());
  span.End();  // Before the run can finish (a trace read then holds it).
  d->done.future().OnReady([done = std::move(done), d](const absl::Status& s) mutable {
    if (!s.ok()) return done.Set(s);
    done.Set(d->device_ns.load(std::memory_order_relaxed));  // Every segment has added its own.
  });
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
  int64_t took = 0;  // In launches: waits before them (inputs, memory, a compile) not counted.
  const trace::Track track = trace::DeviceTrack(device.id(), host_);
  const int64_t client = work.client.value();
  // Waits the device makes before a step (memory, compile) are spans of their own.
  auto wait_span = [&](std::optional<trace::Span>& s, const auto& f, absl::string_view what,
                       const SegmentPlan::Step& step) {
    if (trace::Enabled() && f.valid() && !f.IsReady()) {
      s.emplace(track, what, absl::StrCat(what, ": ", step.node->name), client);
      s->Arg("run", work.run.value()).Arg("node", step.node->name);
    }
  };
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const SegmentPlan::Step& step = plan.steps[i];
    // Why it does not run, if it does not.
    absl::Status s = health.ok() ? device.removed() : health;
    if (s.ok()) s = Cancelled(work.run);
    if (s.ok() && scratch != nullptr &&
        std::any_of(step.outputs.begin(), step.outputs.end(), [](int y) { return y >= 0; })) {
      std::optional<trace::Span> waiting;
      wait_span(waiting, *scratch, "memory wait", step);
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
      std::optional<trace::Span> waiting;
      wait_span(waiting, seg.output_memory[~y], "memory wait", step);
      if (s.ok()) s = AwaitUnlessCancelled(seg.output_memory[~y], work.run);
      if (s.ok()) s = seg.output_memory[~y].status();
      seg.output_memory[~y] = Future<ReservationRef>();
    }
    if (s.ok()) s = step.invalid;
    if (s.ok()) {
      std::optional<trace::Span> compiling;
      wait_span(compiling, step.exe, "compile wait", step);
      s = AwaitUnlessCancelled(step.exe, work.run);  // Compiling, if XLA's.
    }
    if (s.ok()) s = step.exe.status();
    ShardLaunch launch;
    launch.key = {work.run.value(), step.node->node, 0};
    launch.rank = step.rank;
    launch.slice_devices = *step.compute->slice_devices;
    launch.device = device.id();
    launch.collectives = collectives_;
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
    trace::Span compute(track, "compute", step.node->name, client);
    if (compute.active()) {
      compute.Arg("run", work.run.value()).Arg("program", work.program->program);
      compute.Arg("node", step.node->name).Arg("rank", step.rank);
      if (i == 0)
        compute.FlowIn(trace::FlowId(work.run.value(), trace::Stage::kCompute,
                                     device.id().value(), static_cast<int64_t>(work.begin)));
      if (!s.ok()) compute.Arg("error", s.ToString());
    }
    if (s.ok()) {
      const int64_t launched = clock_();
      client_time_.Start(device.id(), work.client, launched);
      Executable::Run run = (*step.exe.Await())->Launch(launch);
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
      const int64_t completed = clock_();
      client_time_.Stop(device.id(), completed);
      took += completed - launched;
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
                               *step.compute->slice_devices);
      // A backend whose shards meet inside it, beyond the runtime's reach (an SPMD module's
      // partitions in XLA's rendezvous), still runs one that did not launch, as a stand-in, so
      // they complete.
      if (!ran.has_value() && step.invalid.ok() && step.exe.valid() && step.exe.Await().ok()) {
        launch.inputs.clear();
        (*step.exe.Await())->RunStandIn(launch);
      }
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
  seg.device_ns->fetch_add(took, std::memory_order_relaxed);  // Before the segment's Done.
}

}  // namespace pw
