#include "absl/strings/string_view.h"
#include "pw/cluster/cluster_spec.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pw {

absl::string_view LinkClassName(LinkClass c) {
  switch (c) {
    case LinkClass::kSameDevice: return "same-device";
    case LinkClass::kIci: return "ici";
    case LinkClass::kDcn: return "dcn";
  }
  return "?";
}

absl::Status ClusterSpec::AddIsland(std::string name,
                                    const std::vector<std::pair<std::string, int>>& hosts,
                                    const std::vector<int64_t>& memory) {
  IslandSpec island{IslandId(static_cast<int64_t>(islands_.size())), std::move(name), {}};
  for (size_t h = 0; h < hosts.size(); ++h) {
    HostSpec host{HostId(static_cast<int64_t>(hosts_.size())), island.id, hosts[h].first, {}};
    for (int d = 0; d < hosts[h].second; ++d) {
      DeviceSpec dev{DeviceId(static_cast<int64_t>(devices_.size())), host.id, island.id, d,
                     memory[h]};
      host.devices.push_back(dev.id);
      devices_.push_back(dev);
    }
    island.hosts.push_back(host.id);
    hosts_.push_back(std::move(host));
  }
  islands_.push_back(std::move(island));
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> ClusterSpec::Uniform(int islands, int hosts_per_island,
                                                 int devices_per_host, int64_t memory) {
  if (islands <= 0 || hosts_per_island <= 0 || devices_per_host <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster needs at least one island, host and device; got islands=", islands,
        " hosts_per_island=", hosts_per_island, " devices_per_host=", devices_per_host));
  }
  if (memory <= 0) return absl::InvalidArgumentError("device memory must be positive");
  ClusterSpec spec;
  for (int i = 0; i < islands; ++i) {
    std::vector<std::pair<std::string, int>> hosts;
    for (int h = 0; h < hosts_per_island; ++h)
      hosts.emplace_back(absl::StrCat("i", i, "h", h), devices_per_host);
    spec.AddIsland(absl::StrCat("island", i), hosts, std::vector<int64_t>(hosts.size(), memory))
        .IgnoreError();
  }
  return spec;
}

namespace {
// obj[key] if it is there (it must be a string), else `fallback`.
absl::StatusOr<std::string> OptionalName(const nlohmann::json& obj, const char* key,
                                         std::string fallback, const std::string& where) {
  if (!obj.contains(key)) return fallback;
  if (!obj[key].is_string())
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be a string"));
  return obj[key].get<std::string>();
}
}  // namespace

absl::StatusOr<ClusterSpec> ClusterSpec::FromJson(absl::string_view text) {
  nlohmann::json j = nlohmann::json::parse(std::string(text), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("cluster spec is not valid JSON");
  if (!j.is_object() || !j.contains("islands") || !j["islands"].is_array() ||
      j["islands"].empty()) {
    return absl::InvalidArgumentError("cluster spec needs a non-empty \"islands\" array");
  }
  int64_t default_memory = kDefaultDeviceMemory;
  if (j.contains("device_memory_bytes")) {
    if (!j["device_memory_bytes"].is_number_integer() || j["device_memory_bytes"].get<int64_t>() <= 0)
      return absl::InvalidArgumentError("\"device_memory_bytes\" must be a positive integer");
    default_memory = j["device_memory_bytes"].get<int64_t>();
  }
  ClusterSpec spec;
  for (size_t i = 0; i < j["islands"].size(); ++i) {
    const auto& ji = j["islands"][i];
    std::string where = absl::StrCat("islands[", i, "]");
    if (!ji.is_object() || !ji.contains("hosts") || !ji["hosts"].is_array() || ji["hosts"].empty())
      return absl::InvalidArgumentError(absl::StrCat(where, " needs a non-empty \"hosts\" array"));
    absl::StatusOr<std::string> name = OptionalName(ji, "name", absl::StrCat("island", i), where);
    if (!name.ok()) return name.status();
    std::vector<std::pair<std::string, int>> hosts;
    std::vector<int64_t> memory;
    for (size_t h = 0; h < ji["hosts"].size(); ++h) {
      const auto& jh = ji["hosts"][h];
      std::string hwhere = absl::StrCat(where, ".hosts[", h, "]");
      if (!jh.is_object() || !jh.contains("devices") || !jh["devices"].is_number_integer() ||
          jh["devices"].get<int64_t>() <= 0 || jh["devices"].get<int64_t>() > 4096)
        return absl::InvalidArgumentError(
            absl::StrCat(hwhere, " needs \"devices\": an integer in [1, 4096]"));
      int64_t mem = default_memory;
      if (jh.contains("device_memory_bytes")) {
        if (!jh["device_memory_bytes"].is_number_integer() ||
            jh["device_memory_bytes"].get<int64_t>() <= 0)
          return absl::InvalidArgumentError(
              absl::StrCat(hwhere, ".device_memory_bytes must be a positive integer"));
        mem = jh["device_memory_bytes"].get<int64_t>();
      }
      absl::StatusOr<std::string> host_name =
          OptionalName(jh, "name", absl::StrCat(*name, "h", h), hwhere);
      if (!host_name.ok()) return host_name.status();
      hosts.emplace_back(*std::move(host_name), jh["devices"].get<int>());
      memory.push_back(mem);
    }
    spec.AddIsland(*std::move(name), hosts, memory).IgnoreError();
  }
  return spec;
}

absl::StatusOr<ClusterSpec> ClusterSpec::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open cluster spec file '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto spec = FromJson(ss.str());
  if (!spec.ok())
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  return spec;
}

std::string ClusterSpec::ToJson() const {
  nlohmann::json j;
  j["islands"] = nlohmann::json::array();
  for (const auto& island : islands_) {
    nlohmann::json ji;
    ji["name"] = island.name;
    ji["hosts"] = nlohmann::json::array();
    for (HostId h : island.hosts) {
      const auto& host = hosts_[h.value()];
      ji["hosts"].push_back({{"name", host.name},
                             {"devices", host.devices.size()},
                             {"device_memory_bytes", devices_[host.devices[0].value()].memory_bytes}});
    }
    j["islands"].push_back(ji);
  }
  return j.dump(2);
}

}  // namespace pw
