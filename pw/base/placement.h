// Placement: where a sharded array lives: a slice's devices (and their hosts and islands), its
// global spec and its sharding over the slice's mesh. Pure bottom layer; immutable once built and
// shared (std::shared_ptr<const Placement>) by every buffer placed alike.
#pragma once

#include <cstdint>
#include <vector>

#include "pw/base/ids.h"
#include "pw/base/shape.h"
#include "pw/base/sharding.h"

namespace pw {

struct Placement {
  SliceId slice;
  std::vector<DeviceId> devices;  // Shard i lives on devices[i].
  std::vector<HostId> hosts;      // Host of each shard.
  std::vector<IslandId> islands;  // Sorted, unique.
  ArraySpec global;
  Sharding sharding;

  int64_t shard_bytes() const {
    return ArraySpec{global.dtype, sharding.ShardShape(global.shape)}.size_bytes();
  }
  bool SameLayout(const Placement& o) const {
    return devices == o.devices && sharding == o.sharding;
  }
};

}  // namespace pw
