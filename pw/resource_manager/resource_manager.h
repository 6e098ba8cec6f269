// ResourceManager: owns every device of every island and hands out virtual slices.
//
// Thread-safe. A slice maps its virtual devices 1:1 onto distinct physical devices; different
// slices may share physical devices (that is how clients share an island). Allocation balances
// load within the placement asked for (SlicePlacement): the least-loaded island (or host) that
// fits, then the least-loaded devices spread across hosts; kSpread puts hosts first. Hosts (with their devices) can be added and devices removed at run time;
// a slice that uses a removed device is broken, and resolving it returns an error naming the
// device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pw/base/mutex.h"
#include "pw/base/ids.h"
#include "pw/cluster/cluster_spec.h"

namespace pw {

// Where a slice's devices may lie.
enum class SlicePlacement {
  kIsland = 0,  // All in one island (SPMD over ICI): the least-loaded island that fits.
  kHost = 1,    // All on one host (one worker process): the least-loaded host that fits.
  kSpread = 2,  // Over as many hosts as possible, across islands when no island fits.
};
absl::string_view SlicePlacementName(SlicePlacement p);  // "island", "host", "spread".

struct SliceRequest {
  int num_devices = 0;
  std::vector<int64_t> mesh_shape;  // Optional; product must equal num_devices. Default [n].
  SlicePlacement placement = SlicePlacement::kIsland;
  // Where the devices may lie (each empty: anywhere): in one of `islands`, on one of `hosts`,
  // in none of `avoid_islands`. Applied before the placement; a slice they leave no room for is
  // refused, naming them.
  std::vector<IslandId> islands;
  std::vector<HostId> hosts;
  std::vector<IslandId> avoid_islands;
};

struct SliceInfo {
  SliceId id;
  ClientId owner;
  std::vector<DeviceId> devices;  // Rank order: virtual device i -> devices[i].
  std::vector<int64_t> mesh_shape;
  std::vector<IslandId> islands;  // Sorted, unique.
  std::vector<HostId> hosts;      // Host of each device, in rank order.
};

struct DeviceState {
  DeviceSpec spec;
  bool alive = true;
  std::string removed_reason;
  int load = 0;  // Live slices using this device.
};

struct HostRegistration {
  HostId host;
  std::vector<DeviceSpec> devices;
};

class ResourceManager {
 public:
  explicit ResourceManager(const ClusterSpec& spec);

  absl::StatusOr<SliceInfo> AllocateSlice(ClientId client, const SliceRequest& request);
  absl::Status ReleaseSlice(ClientId client, SliceId slice);
  // Releases every slice of `client`; returns how many.
  int ReleaseClient(ClientId client);
  // The slice if it is live, owned by `client` and every device is alive; otherwise an error
  // naming the slice and, for a removed device, the device.
  absl::StatusOr<SliceInfo> ResolveSlice(ClientId client, SliceId slice) const;
  // Unavailable naming the first of `devices` that was removed (`what` uses them), if any.
  absl::Status CheckAlive(const std::vector<DeviceId>& devices, absl::string_view what) const;

  // Adds a host with `num_devices` devices to `island` (a new island if island == islands()).
  absl::StatusOr<HostRegistration> AddHost(IslandId island, std::string name, int num_devices,
                                           int64_t memory_bytes);
  absl::Status RemoveDevice(DeviceId device, std::string reason);
  // Puts a removed device back in service (its host's worker rejoined). Slices that used it
  // before resolve again; the buffers it held are gone.
  absl::Status RestoreDevice(DeviceId device);

  std::vector<DeviceState> Devices() const;
  std::vector<DeviceSpec> HostDevices(HostId host) const;  // By device id.
  int num_islands() const;
  absl::StatusOr<DeviceSpec> Device(DeviceId id) const;

 private:
  // The slice if it exists and `client` owns it; NotFound naming it otherwise (another client's
  // slice reads as one that does not exist).
  absl::StatusOr<const SliceInfo*> FindOwned(ClientId client, SliceId slice) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable pw::Mutex mu_;
  std::vector<DeviceState> devices_ ABSL_GUARDED_BY(mu_);  // Indexed by DeviceId.
  int num_islands_ ABSL_GUARDED_BY(mu_) = 0;
  int num_hosts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_slice_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<SliceId, SliceInfo> slices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw
