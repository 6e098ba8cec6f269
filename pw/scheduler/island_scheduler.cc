#include "pw/scheduler/island_scheduler.h"

#include <pthread.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pw/trace/trace.h"

namespace pw {
namespace {

// The tenant of requests submitted without one (tests; the controller always names one).
const std::shared_ptr<const Tenant>& NoTenant() {
  static const auto* t = new std::shared_ptr<const Tenant>(std::make_shared<Tenant>(-1, "", 1.0));
  return *t;
}

// The key of a request's program for its estimate: host programs are built once per plan.
uint64_t ProgramKey(const IslandWork& w) {
  return w.hosts.empty() ? 0 : w.hosts.front().second->id;
}

// Why `host`'s part of `w` is not dispatched: no worker serves it for the run.
absl::Status NoWorker(const IslandWork& w, HostId host) {
  return absl::UnavailableError(
      absl::StrCat(w.run.ToString(), " program '", w.program, "': ", host.ToString(),
                   " has no worker (it failed, or has failed since the run was submitted)"));
}

}  // namespace

IslandScheduler::IslandScheduler(IslandId island, std::unique_ptr<SchedulingPolicy> policy,
                                 WorkerLookup workers, Options options)
    : island_(island),
      workers_(std::move(workers)),
      options_(std::move(options)),
      policy_(std::move(policy)) {
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
    ++generation_;
  }
  thread_.join();
}

void IslandScheduler::InlineDispatch::Run() {
  if (request_ != nullptr) scheduler_->DispatchAndRelease(std::move(request_));
}

DispatchAck IslandScheduler::Submit(IslandWork work, InlineDispatch* deferred) {
  if (work.tenant == nullptr) work.tenant = NoTenant();
  auto r = std::make_unique<ScheduleRequest>();
  r->work = std::move(work);
  DispatchAck ack{r->enqueued.future(), r->done.future()};
  std::unique_ptr<ScheduleRequest> now;
  {
    pw::MutexLock lock(&mu_);
    if (tenants_.try_emplace(r->work.tenant->id(), TenantTotal{r->work.tenant, 0}).second &&
        tenants_.size() > 64)
      DropGoneTenantsLocked();
    // Nothing queued and nothing being dispatched: the policy would pick this request at once,
    // so the submitting thread dispatches it itself (no hand-off to the scheduler thread).
    const bool alone = policy_->size() == 0;
    policy_->Add(std::move(r));
    if (alone && MayPopLocked()) {
      now = PopLocked();
    } else {
      ++generation_;
    }
  }
  if (now == nullptr) return ack;
  if (deferred == nullptr) {
    DispatchAndRelease(std::move(now));
  } else {
    deferred->Run();  // What it held before (none, used as documented).
    deferred->scheduler_ = this;
    deferred->request_ = std::move(now);
  }
  return ack;
}

int64_t IslandScheduler::EstimateLocked(const IslandWork& w) const {
  auto it = estimates_.find(ProgramKey(w));
  if (it != estimates_.end()) return it->second;
  return absl::ToInt64Nanoseconds(options_.first_estimate) * std::max(1, w.devices);
}

std::string IslandScheduler::policy() const {
  pw::MutexLock lock(&mu_);
  return policy_->name();
}

size_t IslandScheduler::queue_depth() const {
  pw::MutexLock lock(&mu_);
  return policy_->size();
}

int64_t IslandScheduler::dispatched() const {
  pw::MutexLock lock(&mu_);
  return dispatched_;
}

int IslandScheduler::in_flight() const {
  pw::MutexLock lock(&mu_);
  return in_flight_;
}

bool IslandScheduler::settled() const {
  pw::MutexLock lock(&mu_);
  return !dispatching_ && waiting_on_ == generation_;
}

absl::Duration IslandScheduler::round_trip() const {
  pw::MutexLock lock(&mu_);
  return absl::Nanoseconds(round_trip_ns_);
}

void IslandScheduler::DropGoneTenantsLocked() {
  // Held only here (and by finished_ records, which name it by id): no client, nothing queued or
  // in flight.
  absl::erase_if(tenants_, [](const auto& kv) { return kv.second.tenant.use_count() == 1; });
}

void IslandScheduler::DropOldFinishedLocked(absl::Time now) {
  while (!finished_.empty() && finished_.front().at < now - absl::Seconds(1)) finished_.pop_front();
}

std::vector<IslandScheduler::TenantLoad> IslandScheduler::TenantLoads() const {
  const absl::Time now = options_.now();
  pw::MutexLock lock(&mu_);
  absl::flat_hash_map<int64_t, TenantLoad> loads;
  for (const auto& [id, n] : policy_->QueuedByTenant()) loads[id].queued = n;
  for (const Finished& f : finished_)
    if (f.at >= now - absl::Seconds(1)) loads[f.tenant].device_ns_last_second += f.device_ns;
  for (const auto& [id, t] : tenants_) loads[id].device_ns_total = t.device_ns;
  std::vector<TenantLoad> out;
  for (auto& [id, load] : loads) {
    auto t = tenants_.find(id);
    if (t == tenants_.end()) continue;
    load.tenant = t->second.tenant;
    out.push_back(std::move(load));
  }
  std::sort(out.begin(), out.end(),
            [](const TenantLoad& a, const TenantLoad& b) { return a.tenant->id() < b.tenant->id(); });
  return out;
}

bool IslandScheduler::MayDispatch() const {
  if (stopping_ || in_flight_ == 0) return true;
  const int64_t window = (absl::ToInt64Nanoseconds(options_.window) + 2 * round_trip_ns_) *
                         std::max(1, options_.devices);
  return in_flight_ < options_.max_in_flight && in_flight_ns_ < window;
}

bool IslandScheduler::MayPopLocked() const {
  return !dispatching_ && !sequential_busy_ && policy_->Peek() != nullptr && MayDispatch();
}

std::unique_ptr<ScheduleRequest> IslandScheduler::PopLocked() {
  ScheduleRequest* next = policy_->Peek();
  next->estimated_ns = EstimateLocked(next->work);  // What it is counted as from now on.
  std::unique_ptr<ScheduleRequest> r = policy_->Pop();
  ++in_flight_;
  in_flight_ns_ += r->estimated_ns;
  ++dispatched_;
  dispatching_ = true;
  if (r->work.mode == DispatchMode::kSequential) sequential_busy_ = true;
  return r;
}

std::unique_ptr<ScheduleRequest> IslandScheduler::Next() {
  pw::MutexLock lock(&mu_);
  while (!MayPopLocked()) {
    // Stopping: everything submitted has gone; what is in flight must finish first (its
    // completions use this scheduler).
    if (stopping_ && !dispatching_ && policy_->size() == 0 && in_flight_ == 0) return nullptr;
    const uint64_t seen = generation_;
    waiting_on_ = seen;
    mu_.Await([this, seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generation_ != seen; });
    waiting_on_.reset();
  }
  return PopLocked();
}

void IslandScheduler::DispatchAndRelease(std::unique_ptr<ScheduleRequest> r) {
  Dispatch(std::move(r));
  pw::MutexLock lock(&mu_);
  dispatching_ = false;
  // What was submitted meanwhile waited for this dispatch; the scheduler thread takes it.
  if (policy_->size() > 0 || stopping_) ++generation_;
}

void IslandScheduler::Loop() {
  while (std::unique_ptr<ScheduleRequest> r = Next()) DispatchAndRelease(std::move(r));
}

struct IslandScheduler::Sequential {
  std::unique_ptr<ScheduleRequest> request;
  std::vector<int32_t> order;  // The nodes, in topological (node index) order.
  size_t next_node = 0;
  std::vector<size_t> next;  // Per host: its next node's position in its host program.
  std::vector<Future<absl::Time>> enqueued;
  std::vector<Future<int64_t>> done;
};

void IslandScheduler::Dispatch(std::unique_ptr<ScheduleRequest> r) {
  const IslandWork& w = r->work;
  // The scheduling decision: this run's turn in the island's gang order.
  trace::Span span(trace::IslandTrack(island_), "schedule", w.program, w.client.value());
  if (span.active()) {
    span.Arg("run", w.run.value()).Arg("program", w.program).Arg("gang_position", dispatched_seq_);
    span.Arg("tenant", w.tenant->name());
    span.FlowIn(trace::FlowId(w.run.value(), trace::Stage::kSchedule, island_.value()));
  }
  ++dispatched_seq_;
  if (w.mode == DispatchMode::kSequential) {
    if (span.active())
      for (const auto& [host, program] : w.hosts)
        for (size_t at = 0; at < program->nodes.size(); ++at)
          span.FlowOut(trace::FlowId(w.run.value(), trace::Stage::kDispatch, host.value(),
                                     static_cast<int64_t>(at)));
    auto seq = std::make_shared<Sequential>();
    for (const auto& [host, program] : w.hosts)
      for (const auto& n : program->nodes) seq->order.push_back(n.node);
    std::sort(seq->order.begin(), seq->order.end());
    seq->order.erase(std::unique(seq->order.begin(), seq->order.end()), seq->order.end());
    seq->next.assign(w.hosts.size(), 0);
    seq->request = std::move(r);
    span.End();  // Before the run can finish (a trace read then holds it).
    return ContinueSequential(std::move(seq));
  }
  // One message per host with all of its nodes; no waiting (nor a separate enqueue ack).
  const absl::Time sent = options_.now();
  std::vector<Future<absl::Time>> enqueued;
  std::vector<Future<int64_t>> done;
  for (const auto& [host, program] : w.hosts) {
    WorkerInterface* worker = workers_(host, w.membership);
    if (worker == nullptr) {
      const absl::Status s = NoWorker(w, host);
      enqueued.push_back(Future<absl::Time>::Ready(s));
      done.push_back(Future<int64_t>::Ready(s));
      continue;
    }
    span.FlowOut(trace::FlowId(w.run.value(), trace::Stage::kDispatch, host.value(), 0));
    DispatchAck ack = worker->Dispatch({w.run, w.client, program, w.buffers, 0,
                                        program->nodes.size(), /*ack_enqueue_at_once=*/false});
    enqueued.push_back(std::move(ack.enqueued));
    done.push_back(std::move(ack.done));
  }
  span.End();  // Before the run can finish (a trace read then holds it).
  Future<absl::Time> latest = LatestOf(enqueued);
  latest.OnReady(
      [p = std::move(r->enqueued)](const absl::StatusOr<absl::Time>& t) mutable { p.Set(t); });
  std::shared_ptr<ScheduleRequest> held(std::move(r));
  SumFutures(done).OnReady([this, held, latest, sent](const absl::StatusOr<int64_t>& ran) {
    // Every host has answered: its answer said when it enqueued the work.
    absl::Duration round_trip;
    if (latest.IsReady() && latest.status().ok())
      round_trip = std::clamp(*latest.Await() - sent, absl::ZeroDuration(), kMaxRoundTrip);
    OnFinished(*held, ran, round_trip);
  });
}

void IslandScheduler::ContinueSequential(std::shared_ptr<Sequential> seq) {
  // Node by node, each after the previous is enqueued on all its hosts; runs on the thread that
  // acknowledged the previous node (or the scheduler's, for the first).
  while (seq->next_node < seq->order.size()) {
    const IslandWork& w = seq->request->work;
    const int32_t node = seq->order[seq->next_node++];
    std::vector<Future<absl::Time>> node_enqueued;
    for (size_t h = 0; h < w.hosts.size(); ++h) {
      const auto& [host, program] = w.hosts[h];
      if (seq->next[h] >= program->nodes.size() || program->nodes[seq->next[h]].node != node)
        continue;
      const size_t at = seq->next[h]++;
      WorkerInterface* worker = workers_(host, w.membership);
      if (worker == nullptr) {
        const absl::Status s = NoWorker(w, host);
        node_enqueued.push_back(Future<absl::Time>::Ready(s));
        seq->done.push_back(Future<int64_t>::Ready(s));
        continue;
      }
      DispatchAck ack = worker->Dispatch({w.run, w.client, program, w.buffers, at, at + 1});
      node_enqueued.push_back(ack.enqueued);
      seq->done.push_back(std::move(ack.done));
    }
    Future<absl::Time> all = LatestOf(node_enqueued);
    seq->enqueued.push_back(all);
    if (!all.IsReady()) {
      all.OnReady([this, seq](const absl::StatusOr<absl::Time>&) { ContinueSequential(seq); });
      return;
    }
  }
  // Every node is out: the island may dispatch the next request.
  {
    pw::MutexLock lock(&mu_);
    sequential_busy_ = false;
    ++generation_;
  }
  LatestOf(seq->enqueued)
      .OnReady([p = std::move(seq->request->enqueued)](const absl::StatusOr<absl::Time>& t) mutable {
        p.Set(t);
      });
  std::shared_ptr<ScheduleRequest> held(std::move(seq->request));
  SumFutures(seq->done).OnReady([this, held](const absl::StatusOr<int64_t>& ran) {
    OnFinished(*held, ran, absl::ZeroDuration());  // Its nodes went one by one: no sample.
  });
}

void IslandScheduler::OnFinished(ScheduleRequest& r, const absl::StatusOr<int64_t>& ran,
                                 absl::Duration round_trip) {
  // A failed request is charged its estimate (what it took is unknown).
  const int64_t took = ran.ok() ? *ran : r.estimated_ns;
  const absl::Time now = options_.now();
  Promise<int64_t> done;
  {
    pw::MutexLock lock(&mu_);
    --in_flight_;
    in_flight_ns_ -= r.estimated_ns;
    policy_->Finished(r, took);
    if (ran.ok()) {
      int64_t& e = estimates_[ProgramKey(r.work)];
      e = e == 0 ? took : (3 * e + took) / 4;
      if (estimates_.size() > 4096) estimates_.clear();  // Programs come and go; relearned.
      if (round_trip > absl::ZeroDuration())
        round_trip_ns_ = (3 * round_trip_ns_ + absl::ToInt64Nanoseconds(round_trip)) / 4;
    }
    finished_.push_back({now, r.work.tenant->id(), took});
    if (auto t = tenants_.find(r.work.tenant->id()); t != tenants_.end()) t->second.device_ns += took;
    DropOldFinishedLocked(now);
    // Wakes the scheduler thread only where it may have something to do now.
    if (policy_->size() > 0 || stopping_) ++generation_;
    done = std::move(r.done);
  }
  done.Set(ran);
}

}  // namespace pw
