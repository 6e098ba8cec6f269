#include "pw/trace/trace_json.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pw::trace {
namespace {

using json = nlohmann::json;

int Pid(const Track& t) {
  switch (t.kind) {
    case Track::Kind::kClient: return 2;
    case Track::Kind::kController:
    case Track::Kind::kIsland: return 1;
    case Track::Kind::kHost:
    case Track::Kind::kTransfers:
    case Track::Kind::kCompile: return 10 + static_cast<int>(t.id);
    case Track::Kind::kDevice: return t.host < 0 ? 3 : 10 + static_cast<int>(t.host);
  }
  return 0;
}

int64_t Tid(const Track& t) {
  switch (t.kind) {
    case Track::Kind::kController: return 1000 + t.id;
    case Track::Kind::kIsland: return 1 + t.id;
    case Track::Kind::kClient: return 1 + t.id;
    case Track::Kind::kHost: return 1;
    case Track::Kind::kTransfers: return 2;
    case Track::Kind::kCompile: return 3;
    case Track::Kind::kDevice: return 1000 + t.id;
  }
  return 0;
}

std::string GroupName(const Track& t) {
  switch (t.kind) {
    case Track::Kind::kClient: return "clients";
    case Track::Kind::kController:
    case Track::Kind::kIsland: return "controller";
    case Track::Kind::kHost:
    case Track::Kind::kTransfers:
    case Track::Kind::kCompile: return absl::StrCat("host ", t.id);
    case Track::Kind::kDevice: return t.host < 0 ? "devices" : absl::StrCat("host ", t.host);
  }
  return "";
}

std::string TrackName(const Track& t, const std::map<int64_t, std::string>& tenants) {
  switch (t.kind) {
    case Track::Kind::kClient: {
      auto it = tenants.find(t.id);
      return it == tenants.end() ? absl::StrCat("client ", t.id)
                                 : absl::StrCat("client ", t.id, " (", it->second, ")");
    }
    case Track::Kind::kController: {
      auto it = tenants.find(t.id);
      return it == tenants.end() ? absl::StrCat("submits of client ", t.id)
                                 : absl::StrCat("submits of client ", t.id, " (", it->second, ")");
    }
    case Track::Kind::kIsland: return absl::StrCat("island ", t.id, " scheduler");
    case Track::Kind::kHost: return absl::StrCat("host ", t.id, " dispatch");
    case Track::Kind::kTransfers: return absl::StrCat("host ", t.id, " transfers in");
    case Track::Kind::kCompile: return absl::StrCat("host ", t.id, " compile");
    case Track::Kind::kDevice: return absl::StrCat("device ", t.id);
  }
  return "";
}

std::string Hex(uint64_t id) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), kDigits[id & 15]);
    id >>= 4;
  } while (id != 0);
  return "0x" + s;
}

}  // namespace

std::map<int64_t, std::string> TenantNames(const Chunk& chunk) {
  std::map<int64_t, std::string> tenants;
  for (const Event& e : chunk.events)
    for (const auto& [k, v] : e.args)
      if (k == "tenant" && e.client >= 0 && std::holds_alternative<std::string>(v))
        tenants.emplace(e.client, std::get<std::string>(v));
  return tenants;
}

std::string ToChromeJson(const Chunk& chunk) {
  const std::map<int64_t, std::string> tenants = TenantNames(chunk);
  // Each device's host, from its spans that name it (a collective's do not).
  std::map<int64_t, int64_t> device_host;
  for (const Event& e : chunk.events)
    if (e.track.kind == Track::Kind::kDevice && e.track.host >= 0)
      device_host.emplace(e.track.id, e.track.host);
  json events = json::array();
  std::set<std::pair<int, int64_t>> tracks;
  std::set<int> groups;
  for (const Event& original : chunk.events) {
    Event e = original;  // Its track with the device's host found.
    if (e.track.kind == Track::Kind::kDevice && e.track.host < 0)
      if (auto it = device_host.find(e.track.id); it != device_host.end()) e.track.host = it->second;
    const int pid = Pid(e.track);
    const int64_t tid = Tid(e.track);
    if (groups.insert(pid).second) {
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0},
                        {"args", {{"name", GroupName(e.track)}}}});
      events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0},
                        {"args", {{"sort_index", pid}}}});
    }
    if (tracks.insert({pid, tid}).second) {
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid},
                        {"args", {{"name", TrackName(e.track, tenants)}}}});
      events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid},
                        {"args", {{"sort_index", tid}}}});
    }
    json j = {{"ph", std::string(1, e.phase)}, {"name", e.name}, {"cat", e.category},
              {"pid", pid}, {"tid", tid}, {"ts", static_cast<double>(e.ts_ns) / 1e3}};
    if (e.phase == 'X') j["dur"] = static_cast<double>(e.dur_ns) / 1e3;
    if (e.phase == 's' || e.phase == 'f') j["id"] = Hex(e.flow);
    if (e.phase == 'f') j["bp"] = "e";
    if (e.phase == 'i') j["s"] = "t";
    json args = json::object();
    for (const auto& [k, v] : e.args) {
      if (std::holds_alternative<int64_t>(v)) args[k] = std::get<int64_t>(v);
      else args[k] = std::get<std::string>(v);
    }
    if (e.client >= 0 && e.phase == 'X') {
      args["client"] = e.client;
      if (auto it = tenants.find(e.client); it != tenants.end() && !args.contains("tenant"))
        args["tenant"] = it->second;
    }
    if (!args.empty()) j["args"] = std::move(args);
    events.push_back(std::move(j));
  }
  json out = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ns"},
              {"otherData",
               {{"format", "pathways trace (Chrome trace-event JSON)"},
                {"clock", "the controller's monotonic clock, in microseconds"},
                {"processes", chunk.processes.size()},
                {"dropped_events", chunk.dropped}}}};
  return out.dump();
}

void Anonymize(Chunk& chunk, int64_t viewer) {
  for (Event& e : chunk.events) {
    if (e.client < 0 || e.client == viewer) continue;
    if (e.phase == 'X') e.name = absl::StrCat("another tenant's ", e.category);
    e.args.clear();
  }
}

}  // namespace pw::trace
