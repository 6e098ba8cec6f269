#include "pw/controller/run_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pw {

void RunManager::End::Set(const absl::Status& s) {
  std::optional<Promise<>> p;
  {
    pw::MutexLock lock(&mu);
    p.swap(promise);
  }
  if (p.has_value()) p->Set(s);
}

RunManager::RunManager(Workers workers, OnDone on_done)
    : workers_(std::move(workers)), on_done_(std::move(on_done)), timeouts_("pw-ctrl-timeout") {}

RunManager::~RunManager() { WaitIdle(); }

void RunManager::WaitIdle() {
  pw::MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_flight_ == 0; });
}

RunManager::Started RunManager::Start(ClientId client, const std::string& program,
                                      absl::Duration timeout) {
  auto end = std::make_shared<End>();
  Started started;
  {
    pw::MutexLock lock(&end->mu);
    started.done = end->promise->future();
  }
  pw::MutexLock lock(&mu_);
  const RunId run(next_run_++);
  started.run = run;
  ++in_flight_;
  Owner& owner = owners_[run];
  owner = {client, program, std::move(end), std::nullopt, absl::Now()};
  if (timeout > absl::ZeroDuration()) {
    // Scheduled under mu_, so Finish (which takes mu_ to erase the owner) sees its id.
    owner.timeout = timeouts_.Schedule(absl::Now() + timeout, [this, run, timeout, program] {
      (void)Cancel(run, absl::DeadlineExceededError(absl::StrCat(
                            run.ToString(), " of program '", program, "' overran its timeout of ",
                            absl::FormatDuration(timeout), " and was cancelled")));
    });
  }
  return started;
}

void RunManager::Finish(RunId run, const absl::Status& s) {
  std::shared_ptr<End> end;
  absl::Time started;
  {
    // Workers keep records of cancelled and failed runs (so late work and collective inputs of
    // them are dropped); now they can go. The run stops being its client's under cancel_mu_, so
    // a CancelClient cannot cancel it after this (its record would never be forgotten).
    pw::MutexLock cancel(&cancel_mu_);
    {
      pw::MutexLock lock(&mu_);
      auto it = owners_.find(run);
      end = it->second.end;
      started = it->second.started;
      if (it->second.timeout.has_value()) timeouts_.Cancel(*it->second.timeout);
      owners_.erase(it);
    }
    if (cancelled_.erase(run) > 0 || !s.ok())
      for (WorkerInterface* w : workers_()) w->ForgetRuns({run});
  }
  {
    // Counted before the client can see the run done, so a status after it includes the run.
    pw::MutexLock lock(&mu_);
    ++completed_;
  }
  if (on_done_) on_done_(absl::Now() - started, s);
  end->Set(s);  // Unless a cancellation has set it first.
  // In flight until here: WaitIdle (and so the destructor) waits for Set's callbacks too.
  pw::MutexLock lock(&mu_);
  --in_flight_;
}

void RunManager::CancelOnWorkers(const std::vector<RunId>& runs, const absl::Status& why) {
  cancelled_.insert(runs.begin(), runs.end());
  for (WorkerInterface* w : workers_()) w->CancelRuns(runs, why);
}

absl::Status RunManager::Cancel(RunId run, const absl::Status& why) {
  std::shared_ptr<End> end;
  {
    pw::MutexLock cancel(&cancel_mu_);
    {
      pw::MutexLock lock(&mu_);
      auto it = owners_.find(run);
      if (it == owners_.end())
        return absl::NotFoundError(absl::StrCat(run.ToString(), " is not in flight"));
      end = it->second.end;
    }
    CancelOnWorkers({run}, why);
  }
  end->Set(why);
  return absl::OkStatus();
}

std::vector<RunId> RunManager::CancelClient(ClientId client, const absl::Status& why,
                                            bool end_them) {
  std::vector<RunId> runs;
  std::vector<std::shared_ptr<End>> ends;
  {
    pw::MutexLock cancel(&cancel_mu_);
    {
      pw::MutexLock lock(&mu_);
      for (const auto& [run, owner] : owners_) {
        if (owner.client != client) continue;
        runs.push_back(run);
        ends.push_back(owner.end);
      }
    }
    if (!runs.empty()) CancelOnWorkers(runs, why);
  }
  if (end_them)
    for (auto& end : ends) end->Set(why);
  std::sort(runs.begin(), runs.end());
  return runs;
}

RunManager::Counts RunManager::Snapshot(size_t max_listed) const {
  Counts c;
  {
    pw::MutexLock lock(&mu_);
    c.in_flight = in_flight_;
    c.completed = completed_;
    for (const auto& [run, owner] : owners_)
      c.running.push_back({run, owner.client, owner.program});
  }
  std::sort(c.running.begin(), c.running.end(),
            [](const auto& a, const auto& b) { return a.run < b.run; });
  if (c.running.size() > max_listed) c.running.resize(max_listed);
  return c;
}

size_t RunManager::size() const {
  pw::MutexLock lock(&mu_);
  return owners_.size();
}

}  // namespace pw
