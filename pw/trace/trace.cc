#include "pw/trace/trace.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>

namespace pw::trace {

Track ClientTrack(ClientId c) { return {Track::Kind::kClient, c.value()}; }
Track ControllerTrack(ClientId c) { return {Track::Kind::kController, c.value()}; }
Track IslandTrack(IslandId i) { return {Track::Kind::kIsland, i.value()}; }
Track HostTrack(HostId h) { return {Track::Kind::kHost, h.value()}; }
Track DeviceTrack(DeviceId d, HostId h) {
  return {Track::Kind::kDevice, d.value(), h.valid() ? h.value() : -1};
}
Track TransfersTrack(HostId h) { return {Track::Kind::kTransfers, h.value()}; }
Track CompileTrack(HostId h) { return {Track::Kind::kCompile, h.value()}; }

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t FlowId(int64_t run, Stage stage, int64_t a, int64_t b) {
  // splitmix64 over the parts: the same in every process (absl::Hash is salted per process).
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(static_cast<uint64_t>(run));
  h = mix(h ^ static_cast<uint64_t>(stage));
  h = mix(h ^ static_cast<uint64_t>(a));
  h = mix(h ^ static_cast<uint64_t>(b));
  h &= (uint64_t{1} << 53) - 1;  // Exact in a JSON (double) reader.
  return h == 0 ? 1 : h;
}

Recorder& Recorder::Get() {
  static Recorder* r = [] {
    auto* p = new Recorder();  // Never destroyed: spans may end during exit.
    p->process_ = true;
    return p;
  }();
  return *r;
}

uint64_t Recorder::NewProcessId() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(Now());
}

int64_t Recorder::Start() {
  const int64_t now = Now();
  sessions_.fetch_add(1, std::memory_order_relaxed);
  if (process_) internal::process_sessions.fetch_add(1, std::memory_order_relaxed);
  return now;
}

std::vector<Event> Recorder::Collect(int64_t since) const {
  pw::MutexLock lock(&mu_);
  std::vector<Event> out;
  for (const Event& e : events_)
    if (e.ts_ns >= since) out.push_back(e);
  return out;
}

void Recorder::Stop() {
  if (process_) internal::process_sessions.fetch_sub(1, std::memory_order_relaxed);
  if (sessions_.fetch_sub(1, std::memory_order_relaxed) != 1) return;
  pw::MutexLock lock(&mu_);
  if (sessions_.load(std::memory_order_relaxed) > 0) return;  // One started meanwhile.
  std::vector<Event>().swap(events_);
  dropped_ = 0;
}

int64_t Recorder::dropped() const {
  pw::MutexLock lock(&mu_);
  return dropped_;
}

void Recorder::Record(Event e) {
  pw::MutexLock lock(&mu_);
  if (events_.size() >= capacity_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

void Span::Begin(Track track, absl::string_view category, absl::string_view name,
                 int64_t client) {
  state_ = std::make_unique<State>();
  Event& e = state_->event;
  e.track = track;
  e.category = std::string(category);
  e.name = std::string(name);
  e.client = client;
  e.ts_ns = Now();
}

void Span::AddArg(absl::string_view key, int64_t value) {
  state_->event.args.emplace_back(std::string(key), value);
}

void Span::AddArg(absl::string_view key, absl::string_view value) {
  state_->event.args.emplace_back(std::string(key), std::string(value));
}

void Span::AddFlow(char phase, uint64_t id) {
  Event f;
  f.phase = phase;
  f.track = state_->event.track;
  f.category = "flow";
  f.name = "run";
  f.ts_ns = Now();
  f.flow = id;
  f.client = state_->event.client;
  state_->flows.push_back(std::move(f));
}

void Span::End() {
  if (state_ == nullptr) return;
  std::unique_ptr<State> s = std::move(state_);
  const int64_t end = Now();
  s->event.dur_ns = end - s->event.ts_ns;
  Recorder& r = Recorder::Get();
  // A flow's end binds to the span enclosing it: keep its time inside the span.
  for (Event& f : s->flows) {
    f.ts_ns = std::clamp(f.ts_ns, s->event.ts_ns, end);
    r.Record(std::move(f));
  }
  r.Record(std::move(s->event));
}

void ClockOffset::Sample(int64_t t0, int64_t remote, int64_t t1) {
  if (t1 < t0) return;
  const S s{remote - (t0 + (t1 - t0) / 2), t1 - t0};
  pw::MutexLock lock(&mu_);
  if (samples_.size() < kWindow) {
    samples_.push_back(s);
  } else {
    samples_[next_] = s;
    next_ = (next_ + 1) % kWindow;
  }
}

int64_t ClockOffset::offset() const {
  pw::MutexLock lock(&mu_);
  if (samples_.empty()) return 0;
  return std::min_element(samples_.begin(), samples_.end(),
                          [](const S& a, const S& b) { return a.rtt < b.rtt; })
      ->offset;
}

int64_t ClockOffset::round_trip() const {
  pw::MutexLock lock(&mu_);
  if (samples_.empty()) return -1;
  return std::min_element(samples_.begin(), samples_.end(),
                          [](const S& a, const S& b) { return a.rtt < b.rtt; })
      ->rtt;
}

void Shift(std::vector<Event>& events, int64_t offset) {
  for (Event& e : events) e.ts_ns += offset;
}

}  // namespace pw::trace
