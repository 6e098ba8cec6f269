#include "pw/server/status_json.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "pw/rpc/wire.h"

namespace pw::server {

namespace v1 = ::pathways::v1;

namespace {

nlohmann::json HostJson(const v1::HostStatus& hs) {
  nlohmann::json h;
  h["island"] = hs.island();
  if (!hs.error().empty()) {  // The controller could not ask this host.
    h["status_error"] = hs.error();
    return h;
  }
  h["buffers"] = hs.buffers();
  h["buffer_bytes"] = hs.buffer_bytes();
  h["ici_bytes_received"] = hs.ici_bytes_received();
  h["dcn_bytes_received"] = hs.dcn_bytes_received();
  h["ici_wire_bytes_received"] = hs.ici_wire_bytes_received();
  h["dcn_wire_bytes_received"] = hs.dcn_wire_bytes_received();
  h["checkpoint_bytes_saved"] = hs.checkpoint_bytes_saved();
  h["checkpoint_bytes_loaded"] = hs.checkpoint_bytes_loaded();
  h["commands_received"] = hs.commands_received();
  h["command_messages_received"] = hs.command_messages_received();
  h["events_sent"] = hs.events_sent();
  h["event_messages_sent"] = hs.event_messages_sent();
  h["events_mailed"] = hs.events_mailed();
  h["dispatch_queue_depth"] = hs.dispatch_queue_depth();
  h["cancelled_shards"] = hs.cancelled_shards();
  h["functions"] = hs.functions();
  h["executables"] = hs.executables();
  h["programs"] = hs.programs();
  h["plans"] = hs.plans();
  h["compiles"] = hs.compiles();
  h["compile_seconds"] = static_cast<double>(hs.compile_ns()) / 1e9;
  h["executable_cache_hits"] = hs.executable_hits();
  h["collectives"] = hs.collectives();
  h["collective_seconds"] = static_cast<double>(hs.collective_ns()) / 1e9;
  h["client_device_seconds"] = nlohmann::json::object();  // Client id -> device time on its work.
  for (const auto& [c, ns] : hs.client_device_ns())
    h["client_device_seconds"][std::to_string(c)] = static_cast<double>(ns) / 1e9;
  h["devices"] = nlohmann::json::array();
  for (const auto& d : hs.devices()) {
    h["devices"].push_back({{"device", d.id()}, {"alive", d.alive()},
                            {"memory_in_use", d.memory_in_use()},
                            {"memory_capacity", d.memory_capacity()},
                            {"queue_depth", d.queue_depth()}, {"executed", d.executed()},
                            {"busy_seconds", static_cast<double>(d.busy_ns()) / 1e9}});
  }
  return h;
}

}  // namespace

std::string StatusJson(const v1::ClusterStatus& st, const std::string& address) {
  nlohmann::json j;
  j["address"] = address;
  if (!st.metrics_address().empty()) j["metrics_address"] = st.metrics_address();
  j["clients"] = st.clients();
  j["runs_in_flight"] = st.runs_in_flight();
  j["runs_completed"] = st.runs_completed();
  j["logical_buffers"] = st.logical_buffers();
  j["scheduler_queue_depth"] = std::vector<int64_t>(st.scheduler_queue_depth().begin(),
                                                    st.scheduler_queue_depth().end());
  // Per island: the round trip its scheduler's window is kept on top of.
  j["scheduler_round_trip_ms"] = nlohmann::json::array();
  for (int64_t ns : st.scheduler_round_trip_ns()) j["scheduler_round_trip_ms"].push_back(ns / 1e6);
  j["running"] = nlohmann::json::array();  // Oldest first; at most kMaxRunningListed.
  for (const auto& r : st.running())
    j["running"].push_back({{"run", r.run()}, {"client", r.client()}, {"program", r.program()}});
  j["scheduling"] = st.scheduling();
  j["tenants"] = nlohmann::json::array();  // By name.
  for (const auto& t : st.tenants())
    j["tenants"].push_back({{"tenant", t.name()}, {"share", t.share()}, {"pinned", t.pinned()},
                            {"memory_quota_bytes", t.memory_quota_bytes()},
                            {"memory_bytes", t.memory_bytes()}, {"clients", t.clients()},
                            {"queued", t.queued()}, {"achieved_share", t.achieved_share()},
                            {"device_seconds", t.device_seconds()}});
  int64_t ici = 0, dcn = 0, ici_wire = 0, dcn_wire = 0, saved = 0, loaded = 0;
  j["hosts"] = nlohmann::json::array();
  auto add = [&](nlohmann::json h, const v1::HostStatus* hs) {
    if (hs != nullptr) {
      h.update(HostJson(*hs));
      ici += hs->ici_bytes_received();
      dcn += hs->dcn_bytes_received();
      ici_wire += hs->ici_wire_bytes_received();
      dcn_wire += hs->dcn_wire_bytes_received();
      saved += hs->checkpoint_bytes_saved();
      loaded += hs->checkpoint_bytes_loaded();
    }
    j["hosts"].push_back(std::move(h));
  };
  auto status_of = [&](int64_t host) -> const v1::HostStatus* {
    for (const auto& hs : st.hosts())
      if (hs.host() == host) return &hs;
    return nullptr;
  };
  for (const auto& m : st.members()) {
    nlohmann::json h = {{"host", m.host()}, {"address", m.address()}, {"alive", m.alive()}};
    if (!m.reason().empty()) h["reason"] = m.reason();
    if (!m.metrics_address().empty()) h["metrics_address"] = m.metrics_address();
    add(std::move(h), status_of(m.host()));
  }
  j["ici_bytes_received"] = ici;
  j["dcn_bytes_received"] = dcn;
  j["ici_wire_bytes_received"] = ici_wire;
  j["dcn_wire_bytes_received"] = dcn_wire;
  j["checkpoint_bytes_saved"] = saved;
  j["checkpoint_bytes_loaded"] = loaded;
  return j.dump(2);
}

std::string StatusJson(const ClusterStatus& status, int64_t clients) {
  v1::ClusterStatus proto;
  rpc::ToProto(status, &proto);
  proto.set_clients(clients);
  std::vector<std::pair<int64_t, const std::string*>> members;  // Host, and why it failed.
  for (const HostStatus& h : status.hosts) members.emplace_back(h.host.value(), nullptr);
  for (const ClusterStatus::FailedHost& f : status.failed_hosts)
    members.emplace_back(f.host.value(), &f.reason);
  std::sort(members.begin(), members.end());
  for (const auto& [host, why] : members) {
    v1::HostMembership* m = proto.add_members();
    m->set_host(host);
    m->set_address("in-process");
    m->set_alive(why == nullptr);
    if (why != nullptr) m->set_reason(*why);
  }
  return StatusJson(proto, "embedded");
}

}  // namespace pw::server
