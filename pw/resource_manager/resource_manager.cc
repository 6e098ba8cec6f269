#include "pw/resource_manager/resource_manager.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pw/base/status_macros.h"

namespace pw {

ResourceManager::ResourceManager(const ClusterSpec& spec) {
  pw::MutexLock lock(&mu_);
  for (const auto& d : spec.devices()) devices_.push_back({d});
  num_islands_ = static_cast<int>(spec.islands().size());
  num_hosts_ = static_cast<int>(spec.hosts().size());
}

absl::string_view SlicePlacementName(SlicePlacement p) {
  switch (p) {
    case SlicePlacement::kIsland: return "island";
    case SlicePlacement::kHost: return "host";
    case SlicePlacement::kSpread: return "spread";
  }
  return "unknown";
}

namespace {
// " in islands [0] on hosts [1, 2] avoiding islands [3]": a request's constraints, for errors.
std::string ConstraintsText(const SliceRequest& r) {
  auto ids = [](const auto& v) {
    return absl::StrCat("[", absl::StrJoin(v, ", ", [](std::string* out, auto id) {
                          absl::StrAppend(out, id.value());
                        }), "]");
  };
  std::string s;
  if (!r.islands.empty()) absl::StrAppend(&s, " in islands ", ids(r.islands));
  if (!r.hosts.empty()) absl::StrAppend(&s, " on hosts ", ids(r.hosts));
  if (!r.avoid_islands.empty()) absl::StrAppend(&s, " avoiding islands ", ids(r.avoid_islands));
  return s;
}
}  // namespace

absl::StatusOr<SliceInfo> ResourceManager::AllocateSlice(ClientId client,
                                                         const SliceRequest& request) {
  const int n = request.num_devices;
  if (n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a slice needs at least one device; requested ", n));
  }
  std::vector<int64_t> mesh = request.mesh_shape.empty() ? std::vector<int64_t>{n}
                                                         : request.mesh_shape;
  int64_t product = 1;
  for (int64_t m : mesh) {
    if (m <= 0 || __builtin_mul_overflow(product, m, &product)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh shape [", absl::StrJoin(mesh, ","), "] has a non-positive or oversized axis"));
    }
  }
  if (product != n) {
    return absl::InvalidArgumentError(absl::StrCat("mesh shape [", absl::StrJoin(mesh, ","),
                                                   "] holds ", product, " devices, not ", n));
  }

  const absl::flat_hash_set<IslandId> islands_allowed(request.islands.begin(),
                                                      request.islands.end());
  const absl::flat_hash_set<HostId> hosts_allowed(request.hosts.begin(), request.hosts.end());
  const absl::flat_hash_set<IslandId> islands_avoided(request.avoid_islands.begin(),
                                                      request.avoid_islands.end());
  const bool constrained =
      !islands_allowed.empty() || !hosts_allowed.empty() || !islands_avoided.empty();
  // Alive and where the request allows.
  auto usable = [&](const DeviceState& d) {
    return d.alive && (islands_allowed.empty() || islands_allowed.contains(d.spec.island)) &&
           (hosts_allowed.empty() || hosts_allowed.contains(d.spec.host)) &&
           !islands_avoided.contains(d.spec.island);
  };

  pw::MutexLock lock(&mu_);
  // Usable devices and load per island.
  std::vector<int> alive(num_islands_, 0), load(num_islands_, 0);
  int total_alive = 0;
  for (const auto& d : devices_) {
    if (!usable(d)) continue;
    alive[d.spec.island.value()]++;
    load[d.spec.island.value()] += d.load;
    total_alive++;
  }
  if (constrained && n > total_alive) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "requested a slice of ", n, " devices", ConstraintsText(request), ", but only ",
        total_alive, " alive devices lie there"));
  }
  if (n > total_alive) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "requested a slice of ", n, " devices, but the cluster has only ", total_alive,
        " alive devices (a slice maps each virtual device to a distinct physical one)"));
  }
  // Least-loaded island (per device) that fits, if any.
  int best = -1;
  double best_load = std::numeric_limits<double>::infinity();
  for (int i = 0; i < num_islands_; ++i) {
    if (alive[i] < n) continue;
    double l = static_cast<double>(load[i]) / alive[i];
    if (l < best_load) {
      best_load = l;
      best = i;
    }
  }
  if (best < 0 && request.placement == SlicePlacement::kIsland) {
    int largest = *std::max_element(alive.begin(), alive.end());
    return absl::ResourceExhaustedError(absl::StrCat(
        "requested ", n, " devices in one island, but the largest island has ", largest,
        " alive devices", constrained ? absl::StrCat(" of those", ConstraintsText(request)) : "",
        " (ask for placement 'spread' to span islands)"));
  }
  // One host: the least-loaded host (per device) with n alive devices.
  int64_t host = -1;
  if (request.placement == SlicePlacement::kHost) {
    absl::flat_hash_map<int64_t, std::pair<int, int>> hosts;  // host -> (alive, load).
    for (const auto& d : devices_) {
      if (!usable(d)) continue;
      auto& [a, l] = hosts[d.spec.host.value()];
      ++a;
      l += d.load;
    }
    double host_load = std::numeric_limits<double>::infinity();
    int largest = 0;
    for (const auto& [h, al] : hosts) {
      largest = std::max(largest, al.first);
      const double l = static_cast<double>(al.second) / std::max(1, al.first);
      if (al.first >= n && (l < host_load || (l == host_load && h < host))) {
        host_load = l;
        host = h;
      }
    }
    if (host < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "requested ", n, " devices on one host, but the largest host has ", largest,
          " alive devices", constrained ? absl::StrCat(" of those", ConstraintsText(request)) : ""));
    }
    best = -1;
  }
  // Greedy: least-loaded device, then a host this slice already uses (as few hosts as the loads
  // allow: one dispatch per host and collectives inside a process), then id. kSpread instead puts
  // the host this slice uses least first, then load.
  absl::flat_hash_map<int64_t, int> host_use;
  absl::flat_hash_set<int64_t> chosen;
  std::vector<DeviceId> picked;
  const bool spread = request.placement == SlicePlacement::kSpread;
  for (int k = 0; k < n; ++k) {
    int pick = -1;
    for (size_t i = 0; i < devices_.size(); ++i) {
      const auto& d = devices_[i];
      if (!usable(d) || chosen.contains(i)) continue;
      if (best >= 0 && d.spec.island.value() != best) continue;
      if (host >= 0 && d.spec.host.value() != host) continue;
      if (pick < 0) {
        pick = static_cast<int>(i);
        continue;
      }
      const auto& p = devices_[pick];
      auto key = [&](const DeviceState& s) {
        const int used = host_use[s.spec.host.value()];
        return spread ? std::make_tuple(used, s.load, s.spec.id.value())
                      : std::make_tuple(s.load, -used, s.spec.id.value());
      };
      if (key(d) < key(p)) pick = static_cast<int>(i);
    }
    chosen.insert(pick);
    host_use[devices_[pick].spec.host.value()]++;
    picked.push_back(devices_[pick].spec.id);
  }
  std::sort(picked.begin(), picked.end());
  SliceInfo info;
  info.id = SliceId(next_slice_++);
  info.owner = client;
  info.devices = picked;
  info.mesh_shape = mesh;
  absl::flat_hash_set<int64_t> islands;
  for (DeviceId d : picked) {
    auto& s = devices_[d.value()];
    s.load++;
    islands.insert(s.spec.island.value());
    info.hosts.push_back(s.spec.host);
  }
  for (int64_t i : islands) info.islands.push_back(IslandId(i));
  std::sort(info.islands.begin(), info.islands.end());
  slices_[info.id] = info;
  return info;
}

absl::StatusOr<const SliceInfo*> ResourceManager::FindOwned(ClientId client, SliceId slice) const {
  // Another client's slice reads as one that does not exist: ids reveal nothing.
  auto it = slices_.find(slice);
  if (it == slices_.end() || it->second.owner != client)
    return absl::NotFoundError(
        absl::StrCat(slice.ToString(), " is not a slice of this client (never allocated, or released)"));
  return &it->second;
}

absl::Status ResourceManager::ReleaseSlice(ClientId client, SliceId slice) {
  pw::MutexLock lock(&mu_);
  PW_ASSIGN_OR_RETURN(const SliceInfo* info, FindOwned(client, slice));
  for (DeviceId d : info->devices) devices_[d.value()].load--;
  slices_.erase(slice);
  return absl::OkStatus();
}

int ResourceManager::ReleaseClient(ClientId client) {
  pw::MutexLock lock(&mu_);
  int n = 0;
  for (auto it = slices_.begin(); it != slices_.end();) {
    if (it->second.owner == client) {
      for (DeviceId d : it->second.devices) devices_[d.value()].load--;
      slices_.erase(it++);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

absl::StatusOr<SliceInfo> ResourceManager::ResolveSlice(ClientId client, SliceId slice) const {
  pw::MutexLock lock(&mu_);
  PW_ASSIGN_OR_RETURN(const SliceInfo* info, FindOwned(client, slice));
  for (DeviceId d : info->devices) {
    const auto& s = devices_[d.value()];
    if (!s.alive) {
      return absl::UnavailableError(absl::StrCat(slice.ToString(), " uses ", d.ToString(),
                                                 ", which was removed: ", s.removed_reason));
    }
  }
  return *info;
}

absl::Status ResourceManager::CheckAlive(const std::vector<DeviceId>& devices,
                                         absl::string_view what) const {
  pw::MutexLock lock(&mu_);
  for (DeviceId d : devices) {
    if (!d.valid() || d.value() >= static_cast<int64_t>(devices_.size()))
      return absl::NotFoundError(absl::StrCat(what, " uses ", d.ToString(), ", which does not exist"));
    const auto& s = devices_[d.value()];
    if (!s.alive)
      return absl::UnavailableError(absl::StrCat(what, " uses ", d.ToString(),
                                                 ", which was removed: ", s.removed_reason));
  }
  return absl::OkStatus();
}

absl::StatusOr<HostRegistration> ResourceManager::AddHost(IslandId island, std::string name,
                                                          int num_devices,
                                                          int64_t memory_bytes) {
  if (num_devices <= 0 || memory_bytes <= 0)
    return absl::InvalidArgumentError(absl::StrCat("host '", name,
                                                   "' needs at least one device and memory"));
  pw::MutexLock lock(&mu_);
  if (!island.valid() || island.value() > num_islands_)
    return absl::InvalidArgumentError(absl::StrCat(island.ToString(), " does not exist (",
                                                   num_islands_, " islands)"));
  if (island.value() == num_islands_) num_islands_++;
  HostRegistration reg{HostId(num_hosts_++), {}};
  for (int i = 0; i < num_devices; ++i) {
    DeviceSpec d{DeviceId(static_cast<int64_t>(devices_.size())), reg.host, island, i,
                 memory_bytes};
    devices_.push_back({d});
    reg.devices.push_back(d);
  }
  return reg;
}

absl::Status ResourceManager::RemoveDevice(DeviceId device, std::string reason) {
  pw::MutexLock lock(&mu_);
  if (!device.valid() || device.value() >= static_cast<int64_t>(devices_.size()))
    return absl::NotFoundError(absl::StrCat(device.ToString(), " does not exist"));
  auto& d = devices_[device.value()];
  if (!d.alive)
    return absl::FailedPreconditionError(absl::StrCat(device.ToString(), " was already removed"));
  d.alive = false;
  d.removed_reason = std::move(reason);
  return absl::OkStatus();
}

absl::Status ResourceManager::RestoreDevice(DeviceId device) {
  pw::MutexLock lock(&mu_);
  if (!device.valid() || device.value() >= static_cast<int64_t>(devices_.size()))
    return absl::NotFoundError(absl::StrCat(device.ToString(), " does not exist"));
  auto& d = devices_[device.value()];
  d.alive = true;
  d.removed_reason.clear();
  return absl::OkStatus();
}

std::vector<DeviceState> ResourceManager::Devices() const {
  pw::MutexLock lock(&mu_);
  return devices_;
}

std::vector<DeviceSpec> ResourceManager::HostDevices(HostId host) const {
  pw::MutexLock lock(&mu_);
  std::vector<DeviceSpec> out;
  for (const DeviceState& d : devices_)
    if (d.spec.host == host) out.push_back(d.spec);
  return out;
}

int ResourceManager::num_islands() const {
  pw::MutexLock lock(&mu_);
  return num_islands_;
}

absl::StatusOr<DeviceSpec> ResourceManager::Device(DeviceId id) const {
  pw::MutexLock lock(&mu_);
  if (!id.valid() || id.value() >= static_cast<int64_t>(devices_.size()))
    return absl::NotFoundError(absl::StrCat(id.ToString(), " does not exist"));
  return devices_[id.value()].spec;
}

}  // namespace pw
