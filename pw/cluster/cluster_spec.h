// ClusterSpec: the islands -> hosts -> devices of a cluster, and the link class between devices.
//
// Read from a JSON file or built from flags (Uniform). IDs are assigned densely in file order:
// islands 0.., hosts 0.. across islands, devices 0.. across hosts. Immutable after creation;
// run-time additions go through the resource manager, which hands out fresh IDs.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/base/ids.h"

namespace pw {

// How two devices are connected: the same device, fast links inside an island (ICI), or the
// datacenter network between islands (DCN).
enum class LinkClass { kSameDevice, kIci, kDcn };
absl::string_view LinkClassName(LinkClass c);

struct DeviceSpec {
  DeviceId id;
  HostId host;
  IslandId island;
  int index_on_host = 0;
  int64_t memory_bytes = 0;  // Budget for buffers in this device's memory.
};

struct HostSpec {
  HostId id;
  IslandId island;
  std::string name;
  std::vector<DeviceId> devices;
};

struct IslandSpec {
  IslandId id;
  std::string name;
  std::vector<HostId> hosts;
};

class ClusterSpec {
 public:
  static constexpr int64_t kDefaultDeviceMemory = int64_t{1} << 30;

  // {"device_memory_bytes": N?, "islands": [{"name": S?, "hosts": [{"name": S?, "devices": N,
  //   "device_memory_bytes": N?}]}]}
  static absl::StatusOr<ClusterSpec> FromJson(absl::string_view json);
  static absl::StatusOr<ClusterSpec> FromFile(const std::string& path);
  static absl::StatusOr<ClusterSpec> Uniform(int islands, int hosts_per_island,
                                             int devices_per_host,
                                             int64_t device_memory_bytes = kDefaultDeviceMemory);

  const std::vector<IslandSpec>& islands() const { return islands_; }
  const std::vector<HostSpec>& hosts() const { return hosts_; }
  const std::vector<DeviceSpec>& devices() const { return devices_; }
  const HostSpec& host(HostId id) const { return hosts_[id.value()]; }
  const DeviceSpec& device(DeviceId id) const { return devices_[id.value()]; }
  std::string ToJson() const;

 private:
  absl::Status AddIsland(std::string name, const std::vector<std::pair<std::string, int>>& hosts,
                         const std::vector<int64_t>& memory);
  std::vector<IslandSpec> islands_;
  std::vector<HostSpec> hosts_;
  std::vector<DeviceSpec> devices_;
};

}  // namespace pw
