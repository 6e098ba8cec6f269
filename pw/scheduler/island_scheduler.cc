#include "pw/scheduler/island_scheduler.h"

#include <pthread.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pw/trace/trace.h"

namespace pw {

IslandScheduler::IslandScheduler(IslandId island, std::unique_ptr<SchedulingPolicy> policy,
                                 WorkerLookup workers)
    : island_(island), workers_(std::move(workers)), policy_(std::move(policy)) {
  thread_ = std::thread([this] {
    std::string name = absl::StrCat("pw-sched", island_.value());
    pthread_setname_np(pthread_self(), name.c_str());
    Loop();
  });
}

IslandScheduler::~IslandScheduler() {
  {
    pw::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

DispatchAck IslandScheduler::Submit(IslandWork work) {
  auto r = std::make_unique<ScheduleRequest>();
  r->work = std::move(work);
  DispatchAck ack{r->enqueued.future(), r->done.future()};
  pw::MutexLock lock(&mu_);
  policy_->Add(std::move(r));
  return ack;
}

size_t IslandScheduler::queue_depth() const {
  pw::MutexLock lock(&mu_);
  return policy_->size();
}

int64_t IslandScheduler::dispatched() const {
  pw::MutexLock lock(&mu_);
  return dispatched_;
}

void IslandScheduler::Loop() {
  while (true) {
    std::unique_ptr<ScheduleRequest> r;
    {
      pw::MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return HasWork(); });
      r = policy_->Next();
      if (r == nullptr) return;  // Stopping and drained.
    }
    DispatchOne(*r);
    pw::MutexLock lock(&mu_);
    ++dispatched_;
  }
}

void IslandScheduler::DispatchOne(ScheduleRequest& r) {
  std::vector<Future<>> enqueued, done;
  auto unreachable = [&](HostId h) {
    absl::Status s = absl::UnavailableError(absl::StrCat(
        r.work.run.ToString(), " program '", r.work.program, "': ", h.ToString(),
        " has no worker"));
    enqueued.push_back(Future<>::Ready(s));
    done.push_back(Future<>::Ready(s));
  };
  const IslandWork& w = r.work;
  // The scheduling decision: this run's turn in the island's gang order.
  trace::Span span(trace::IslandTrack(island_), "schedule", w.program, w.client.value());
  if (span.active()) {
    span.Arg("run", w.run.value()).Arg("program", w.program).Arg("gang_position", dispatched_seq_);
    span.FlowIn(trace::FlowId(w.run.value(), trace::Stage::kSchedule, island_.value()));
  }
  ++dispatched_seq_;
  if (w.mode == DispatchMode::kParallel) {
    // One message per host with all of its nodes; no waiting.
    for (const auto& [host, program] : w.hosts) {
      WorkerInterface* worker = workers_(host);
      if (worker == nullptr) {
        unreachable(host);
        continue;
      }
      span.FlowOut(trace::FlowId(w.run.value(), trace::Stage::kDispatch, host.value(), 0));
      DispatchAck ack = worker->Dispatch({w.run, w.client, program, w.buffers, 0, program->nodes.size()});
      enqueued.push_back(ack.enqueued);
      done.push_back(ack.done);
    }
  } else {
    // Node by node, in topological (node index) order, each after the previous is enqueued.
    std::vector<int32_t> order;
    for (const auto& [host, program] : w.hosts)
      for (const auto& n : program->nodes) order.push_back(n.node);
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    std::vector<size_t> next(w.hosts.size(), 0);
    for (int32_t node : order) {
      std::vector<Future<>> node_enqueued;
      for (size_t h = 0; h < w.hosts.size(); ++h) {
        const auto& [host, program] = w.hosts[h];
        if (next[h] >= program->nodes.size() || program->nodes[next[h]].node != node) continue;
        const size_t at = next[h]++;
        WorkerInterface* worker = workers_(host);
        if (worker == nullptr) {
          unreachable(host);
          continue;
        }
        span.FlowOut(trace::FlowId(w.run.value(), trace::Stage::kDispatch, host.value(),
                                   static_cast<int64_t>(at)));
        DispatchAck ack = worker->Dispatch({w.run, w.client, program, w.buffers, at, at + 1});
        node_enqueued.push_back(ack.enqueued);
        done.push_back(ack.done);
      }
      Future<> all = JoinFutures(node_enqueued);
      all.status().IgnoreError();  // Wait: the next node goes out only after this one is enqueued.
      enqueued.push_back(all);
    }
  }
  JoinFutures(enqueued).OnReady(
      [p = std::move(r.enqueued)](const absl::Status& s) mutable { p.Set(s); });
  JoinFutures(done).OnReady([p = std::move(r.done)](const absl::Status& s) mutable { p.Set(s); });
}

}  // namespace pw
