// Dashboard: a live web view of a cluster (`pw dashboard`): islands, hosts and devices as the
// paper draws them, each device's queue depth, utilization and memory, each host's link
// traffic, the programs running by tenant, and a rolling timeline of the last seconds'
// computations per device, coloured by tenant. One page of plain HTML/JS (page.html, served
// from the binary; no CDN) polling one JSON endpoint.
//
//   GET /            the page
//   GET /api/state   {"status": <pw status --json>, "at_ms": when, "previous": {"status",
//                    "at_ms"} or null (an earlier status, for rates on a page's first load),
//                    "timeline": {...}, "error": "..."}
//
// The timeline comes from traces (pw/trace): every `period` the dashboard's client records the
// cluster for `window`, so while a dashboard is open the cluster traces that fraction of the
// time (the cost pw/trace/README.md gives, for window/period of it).
//
// Thread-safe: civetweb's threads serve requests; one thread records the timeline.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pw/base/mutex.h"
#include "pw/client/client.h"

struct mg_context;
struct mg_connection;

namespace pw::dashboard {

struct Options {
  std::string listen = "127.0.0.1:0";  // host:port (port 0: a free one).
  // The cluster's status as `pw status --json` prints it.
  std::function<absl::StatusOr<std::string>()> status;
  Client* tracer = nullptr;  // Records the timeline; must outlive the dashboard.
  bool all_tenants = false;  // Client::StopTrace's (needs the cluster token over the wire).
  absl::Duration window = absl::Seconds(1);
  absl::Duration period = absl::Seconds(2);
  size_t max_spans = 4000;   // The timeline keeps the latest this many computations.
};

// The statuses /api/state serves, and the earlier one it gives beside the latest so that a page
// has rates (utilization, link traffic) from its first load: the first status of a period at
// least `min_gap` before the latest, if not older than `max_age`. Not thread-safe.
class StatusHistory {
 public:
  StatusHistory(int64_t min_gap_ms = 500, int64_t max_age_ms = 30000)
      : min_gap_ms_(min_gap_ms), max_age_ms_(max_age_ms) {}
  // Records `status` (JSON) taken at `at_ms`; returns {"status", "at_ms"} of the earlier one, or
  // "null".
  std::string Add(const std::string& status, int64_t at_ms);

 private:
  struct Snapshot {
    std::string status;
    int64_t at_ms = -1;  // -1: none.
  };
  const int64_t min_gap_ms_, max_age_ms_;
  Snapshot earlier_, latest_;
};

class Dashboard {
 public:
  static absl::StatusOr<std::unique_ptr<Dashboard>> Start(Options options);
  ~Dashboard();  // Stops serving and recording.

  // http://host:port/
  const std::string& url() const { return url_; }
  // The JSON /api/state serves.
  std::string StateJson();
  // How many timeline windows have been recorded.
  int64_t windows() const;

 private:
  explicit Dashboard(Options options) : options_(std::move(options)) {}
  void RecordLoop();
  static int ServePage(mg_connection* conn, void* self);
  static int ServeState(mg_connection* conn, void* self);

  const Options options_;
  mg_context* ctx_ = nullptr;
  std::string url_;
  mutable pw::Mutex mu_;
  std::string timeline_ ABSL_GUARDED_BY(mu_) = "null";
  std::string timeline_error_ ABSL_GUARDED_BY(mu_);
  int64_t windows_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  StatusHistory history_ ABSL_GUARDED_BY(mu_);
  std::thread recorder_;
};

// The timeline JSON of one trace window: {"start_us", "end_us", "tenants": {client: name},
// "devices": [ids], "spans": [{"device", "start_ms", "dur_ms", "client", "name"}, ...]}.
std::string TimelineJson(const trace::Chunk& chunk, int64_t start_ns, int64_t end_ns,
                         size_t max_spans);

// The page (page.html).
extern const char kPage[];

}  // namespace pw::dashboard
