// Trace: spans of what the cluster did, where and when (the paper's Fig. 9 is one), recorded
// in each process while a trace is on, and written as Chrome trace-event JSON (trace_json.h).
//
// Off (the default), a span costs one relaxed atomic load; nothing is allocated. On, each span
// appends one Event to the process's Recorder under a mutex, up to a cap (events past it are
// counted as dropped, not kept).
//
// Tracks are logical, not OS threads: a device's spans are on the device's track whether its
// host is a worker process or part of an embedded cluster, so both draw the same picture.
// Flows (FlowOut/FlowIn with one id) link a run's spans across tracks and processes: client
// call -> controller submit -> island scheduler -> host dispatch -> device compute.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"

namespace pw::trace {

// Where a span is drawn: a track (a Chrome trace thread) of a group (a Chrome trace process).
struct Track {
  enum class Kind : int8_t {
    kClient = 0,      // id: the client; group "clients".
    kController = 1,  // id: a client; the controller's work for it (submits); group "controller".
    kIsland = 2,      // id: the island; its gang scheduler; group "controller".
    kHost = 3,        // id: the host; its dispatch and transfers; group "host <id>".
    kDevice = 4,      // id: the device, host: its host (-1: found from the device's other
                      // spans); group "host <host>".
    kTransfers = 5,   // id: the host; the transfers it receives.
    kCompile = 6,     // id: the host; its compile thread.
  };
  Kind kind = Kind::kController;
  int64_t id = 0;
  int64_t host = -1;  // kDevice only.
  bool operator==(const Track& o) const {
    return kind == o.kind && id == o.id && host == o.host;
  }
};
Track ClientTrack(ClientId c);
// The controller's work for client `c` (its submits: concurrent clients' overlap in time).
Track ControllerTrack(ClientId c);
Track IslandTrack(IslandId i);
Track HostTrack(HostId h);
Track DeviceTrack(DeviceId d, HostId h = HostId());
Track TransfersTrack(HostId h);
Track CompileTrack(HostId h);

using ArgValue = std::variant<int64_t, std::string>;

struct Event {
  char phase = 'X';  // 'X' span, 's' flow out, 'f' flow in, 'i' instant.
  Track track;
  std::string name;
  std::string category;  // "call", "submit", "schedule", "dispatch", "compute", "transfer", ...
  int64_t ts_ns = 0;     // Start, on the recording process's clock (Now()).
  int64_t dur_ns = 0;    // 'X' only.
  uint64_t flow = 0;     // 's' and 'f' only.
  int64_t client = -1;   // Whose work it is (-1: nobody's): other clients' spans are anonymized.
  std::vector<std::pair<std::string, ArgValue>> args;
};

// The process's monotonic clock, in nanoseconds (steady_clock; what Event::ts_ns is on).
int64_t Now();

// Flow ids: the same in every process for the same (run, stage, a, b); never 0.
enum class Stage : uint8_t { kCall = 1, kSchedule = 2, kDispatch = 3, kCompute = 4, kTransfer = 5 };
uint64_t FlowId(int64_t run, Stage stage, int64_t a = 0, int64_t b = 0);

namespace internal {
// Sessions of the process's recorder (Recorder::Get()): what Enabled() reads, inline.
inline std::atomic<int> process_sessions{0};
}  // namespace internal

// The process's events while any trace is on.
class Recorder {
 public:
  static constexpr size_t kDefaultCapacity = 1 << 20;  // Events per process (~150 MB at most).
  static Recorder& Get();  // The process's.
  explicit Recorder(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  bool enabled() const { return sessions_.load(std::memory_order_relaxed) > 0; }
  // Starts a session (recording is on while any is): returns its start on Now()'s clock.
  int64_t Start();
  // The session's events: every event from `since` on (the recorder's clock).
  std::vector<Event> Collect(int64_t since) const;
  // Ends a session; the last one's end clears the events.
  void Stop();
  int sessions() const { return sessions_.load(std::memory_order_relaxed); }
  // Events not kept since the buffer last cleared (it was full).
  int64_t dropped() const;
  // This process, for telling whether a collected trace already holds it (random at start).
  uint64_t process_id() const { return process_id_; }

  void Record(Event e);

 private:
  const size_t capacity_;
  bool process_ = false;  // Get()'s: mirrors sessions_ into internal::process_sessions.
  const uint64_t process_id_ = NewProcessId();
  static uint64_t NewProcessId();
  std::atomic<int> sessions_{0};
  mutable pw::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// Whether the process's recorder is on: one relaxed load, inline (spans off cost only this).
// Built with PW_TRACE_OFF (cmake -DPW_TRACE_OFF=ON), never: the spans compile away, which is
// what tracing-off's cost is measured against.
inline bool Enabled() {
#ifdef PW_TRACE_OFF
  return false;
#else
  return internal::process_sessions.load(std::memory_order_relaxed) > 0;
#endif
}

// A span on `track` from construction to destruction (or End()), recorded only if tracing was
// on when it began. Args and flows are dropped when it is inactive, at the cost of one branch.
class Span {
 public:
  Span(Track track, absl::string_view category, absl::string_view name, int64_t client = -1) {
    if (Enabled()) [[unlikely]] Begin(track, category, name, client);
  }
  ~Span() {
    if (state_ != nullptr) [[unlikely]] End();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  bool active() const { return state_ != nullptr; }
  // Inline: an inactive span's args and flows cost a branch, not a call.
  Span& Arg(absl::string_view key, int64_t value) {
    if (state_ != nullptr) [[unlikely]] AddArg(key, value);
    return *this;
  }
  Span& Arg(absl::string_view key, absl::string_view value) {
    if (state_ != nullptr) [[unlikely]] AddArg(key, value);
    return *this;
  }
  // A flow arrow from this span (drawn from now) to the span that calls FlowIn(id).
  Span& FlowOut(uint64_t id) {
    if (state_ != nullptr) [[unlikely]] AddFlow('s', id);
    return *this;
  }
  // The end of flow `id`, at this span.
  Span& FlowIn(uint64_t id) {
    if (state_ != nullptr) [[unlikely]] AddFlow('f', id);
    return *this;
  }
  void End();

 private:
  void Begin(Track track, absl::string_view category, absl::string_view name, int64_t client);
  void AddArg(absl::string_view key, int64_t value);
  void AddArg(absl::string_view key, absl::string_view value);
  void AddFlow(char phase, uint64_t id);
  struct State {
    Event event;
    std::vector<Event> flows;
  };
  std::unique_ptr<State> state_;  // Only while active: an inactive span is one null pointer.
};

// Estimates the offset of a remote clock from samples of a request/response exchange: local
// send time t0, the remote's clock read while answering, local receive time t1. The sample with
// the shortest round trip of the last kWindow bounds the error best (±rtt/2).
class ClockOffset {
 public:
  static constexpr int kWindow = 16;
  void Sample(int64_t t0, int64_t remote, int64_t t1);
  // remote - local, in ns (0 before any sample).
  int64_t offset() const;
  int64_t round_trip() const;  // Of the sample the offset comes from; -1 before any.

 private:
  mutable pw::Mutex mu_;
  struct S {
    int64_t offset, rtt;
  };
  std::vector<S> samples_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

// What one trace gathered: every process's events on the controller's clock.
struct Chunk {
  std::vector<Event> events;
  std::vector<uint64_t> processes;  // Recorder::process_id of each process whose events are in.
  int64_t dropped = 0;
  int64_t clock = 0;  // The controller's clock (Now()) when the chunk was made.
};

// Shifts events onto another clock (adds `offset` ns to each start).
void Shift(std::vector<Event>& events, int64_t offset);

}  // namespace pw::trace
