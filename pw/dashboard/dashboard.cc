#include "pw/dashboard/dashboard.h"

#include <civetweb.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "pw/trace/trace_json.h"

namespace pw::dashboard {
namespace {

using json = nlohmann::json;

int Send(mg_connection* conn, const char* type, const std::string& body) {
  mg_send_http_ok(conn, type, static_cast<long long>(body.size()));
  mg_write(conn, body.data(), body.size());
  return 200;
}

}  // namespace

std::string TimelineJson(const trace::Chunk& chunk, int64_t start_ns, int64_t end_ns,
                         size_t max_spans) {
  const std::map<int64_t, std::string> tenants = trace::TenantNames(chunk);
  std::vector<const trace::Event*> compute;
  std::set<int64_t> devices;
  for (const trace::Event& e : chunk.events) {
    if (e.phase != 'X' || e.category != "compute" || e.track.kind != trace::Track::Kind::kDevice)
      continue;
    compute.push_back(&e);
    devices.insert(e.track.id);
  }
  std::sort(compute.begin(), compute.end(),
            [](const trace::Event* a, const trace::Event* b) { return a->ts_ns < b->ts_ns; });
  if (compute.size() > max_spans) compute.erase(compute.begin(), compute.end() - max_spans);
  json spans = json::array();
  for (const trace::Event* e : compute)
    spans.push_back({{"device", e->track.id},
                     {"start_ms", static_cast<double>(e->ts_ns - start_ns) / 1e6},
                     {"dur_ms", static_cast<double>(e->dur_ns) / 1e6},
                     {"client", e->client},
                     {"name", e->name}});
  json names = json::object();
  for (const auto& [c, n] : tenants) names[absl::StrCat(c)] = n;
  for (const trace::Event* e : compute)  // Anonymous tenants still get a colour and a label.
    if (e->client >= 0 && !names.contains(absl::StrCat(e->client)))
      names[absl::StrCat(e->client)] = absl::StrCat("client ", e->client);
  return json{{"window_ms", static_cast<double>(end_ns - start_ns) / 1e6},
              {"tenants", std::move(names)},
              {"devices", json(std::vector<int64_t>(devices.begin(), devices.end()))},
              {"spans", std::move(spans)}}
      .dump();
}

absl::StatusOr<std::unique_ptr<Dashboard>> Dashboard::Start(Options options) {
  if (!options.status || options.tracer == nullptr)
    return absl::InvalidArgumentError("dashboard: needs a status source and a tracing client");
  std::unique_ptr<Dashboard> d(new Dashboard(std::move(options)));
  const std::string& listen = d->options_.listen;
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("dashboard: listen '", listen,
                                                   "' is not host:port"));
  const std::string ports = listen;  // civetweb takes host:port as is.
  const char* opts[] = {"listening_ports", ports.c_str(), "num_threads", "4", nullptr};
  mg_callbacks callbacks{};
  d->ctx_ = mg_start(&callbacks, nullptr, opts);
  if (d->ctx_ == nullptr)
    return absl::UnavailableError(absl::StrCat("dashboard: cannot listen on ", listen));
  mg_server_port bound[2];
  const int n = mg_get_server_ports(d->ctx_, 2, bound);
  if (n < 1) return absl::UnavailableError("dashboard: no listening port");
  d->url_ = absl::StrCat("http://", listen.substr(0, colon), ":", bound[0].port, "/");
  // Every URI is ours ("/" is a prefix of all): civetweb's own 404 (no document root) crashed
  // in Debian's 1.15 when a browser asked for /favicon.ico.
  mg_set_request_handler(d->ctx_, "/api/state$", &Dashboard::ServeState, d.get());
  mg_set_request_handler(d->ctx_, "/", &Dashboard::ServePage, d.get());
  d->recorder_ = std::thread([p = d.get()] { p->RecordLoop(); });
  return d;
}

Dashboard::~Dashboard() {
  {
    pw::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (recorder_.joinable()) recorder_.join();
  if (ctx_ != nullptr) mg_stop(ctx_);
}

int64_t Dashboard::windows() const {
  pw::MutexLock lock(&mu_);
  return windows_;
}

void Dashboard::RecordLoop() {
  auto stopped_within = [this](absl::Duration d) {
    pw::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; }, d);
  };
  while (!stopped_within(absl::ZeroDuration())) {
    const int64_t start = trace::Now();
    absl::Status started = options_.tracer->StartTrace();
    absl::StatusOr<trace::Chunk> chunk = trace::Chunk{};
    if (!started.ok()) chunk = started;
    if (started.ok()) {
      const bool stop = stopped_within(options_.window);
      chunk = options_.tracer->StopTrace(options_.all_tenants);
      if (stop) return;
    }
    const int64_t end = trace::Now();
    {
      pw::MutexLock lock(&mu_);
      if (chunk.ok()) {
        // The chunk is on the controller's clock; the window's ends on ours: shift them.
        const int64_t offset = chunk->clock - end;
        timeline_ = TimelineJson(*chunk, start + offset, end + offset, options_.max_spans);
        timeline_error_.clear();
        ++windows_;
      } else {
        timeline_error_ = std::string(chunk.status().message());
      }
    }
    if (stopped_within(options_.period - options_.window)) return;
  }
}

std::string StatusHistory::Add(const std::string& status, int64_t at_ms) {
  if (latest_.at_ms >= 0 && at_ms - latest_.at_ms >= min_gap_ms_) {
    earlier_ = std::move(latest_);
    latest_ = Snapshot();
  }
  if (latest_.at_ms < 0) latest_ = {status, at_ms};
  if (earlier_.at_ms < 0 || at_ms - earlier_.at_ms > max_age_ms_) return "null";
  return absl::StrCat("{\"status\": ", earlier_.status, ", \"at_ms\": ", earlier_.at_ms, "}");
}

std::string Dashboard::StateJson() {
  absl::StatusOr<std::string> status = options_.status();
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  std::string timeline, error, previous = "null";
  {
    pw::MutexLock lock(&mu_);
    timeline = timeline_;
    error = timeline_error_;
    if (status.ok()) previous = history_.Add(*status, now_ms);
  }
  if (!status.ok()) error = std::string(status.status().message());
  return absl::StrCat("{\"status\": ", status.ok() ? *status : "null", ", \"at_ms\": ", now_ms,
                      ", \"previous\": ", previous, ", \"timeline\": ", timeline,
                      ", \"error\": ", json(error).dump(), "}");
}

int Dashboard::ServePage(mg_connection* conn, void*) {
  const mg_request_info* req = mg_get_request_info(conn);
  if (req == nullptr || req->local_uri == nullptr || std::string(req->local_uri) != "/") {
    mg_printf(conn, "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
                    "Content-Length: 10\r\nConnection: close\r\n\r\nnot found\n");
    return 404;
  }
  return Send(conn, "text/html; charset=utf-8", kPage);
}

int Dashboard::ServeState(mg_connection* conn, void* self) {
  return Send(conn, "application/json", static_cast<Dashboard*>(self)->StateJson());
}

}  // namespace pw::dashboard
