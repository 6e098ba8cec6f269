// Controller: traces (pw/trace) of the whole cluster, for one client at a time each.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/controller/controller.h"
#include "pw/trace/trace_json.h"

namespace pw {

absl::StatusOr<int64_t> Controller::StartTrace(ClientId client) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  {
    pw::MutexLock lock(&mu_);
    if (traces_.contains(client))
      return absl::FailedPreconditionError(
          absl::StrCat(client.ToString(), " is tracing already (one trace per client at a time)"));
    traces_[client] = trace::Recorder::Get().Start();
  }
  if (options_.start_remote_traces) options_.start_remote_traces();
  return trace::Now();
}

Future<trace::Chunk> Controller::StopTrace(ClientId client, bool all_tenants) {
  int64_t since;
  {
    pw::MutexLock lock(&mu_);
    auto it = traces_.find(client);
    if (it == traces_.end())
      return Future<trace::Chunk>::Ready(
          absl::FailedPreconditionError(absl::StrCat(client.ToString(), " is not tracing")));
    since = it->second;
    traces_.erase(it);
  }
  trace::Recorder& recorder = trace::Recorder::Get();
  auto local = std::make_shared<trace::Chunk>();
  local->events = recorder.Collect(since);
  local->processes.push_back(recorder.process_id());
  local->dropped = recorder.dropped();
  recorder.Stop();
  Future<trace::Chunk> remote = options_.stop_remote_traces
                                    ? options_.stop_remote_traces()
                                    : Future<trace::Chunk>::Ready(trace::Chunk{});
  Promise<trace::Chunk> merged;
  Future<trace::Chunk> result = merged.future();
  remote.OnReady([local, since, client, all_tenants, merged = std::move(merged)](
                     const absl::StatusOr<trace::Chunk>& r) mutable {
    trace::Chunk out = std::move(*local);
    if (r.ok()) {  // A worker process that cannot be asked leaves its spans out, not the trace.
      for (const trace::Event& e : r->events)
        if (e.ts_ns >= since) out.events.push_back(e);
      out.processes.insert(out.processes.end(), r->processes.begin(), r->processes.end());
      out.dropped += r->dropped;
    }
    std::stable_sort(out.events.begin(), out.events.end(),
                     [](const trace::Event& a, const trace::Event& b) { return a.ts_ns < b.ts_ns; });
    if (!all_tenants) trace::Anonymize(out, client.value());
    out.clock = trace::Now();
    merged.Set(std::move(out));
  });
  return result;
}

}  // namespace pw
