// ObjectStore: one host's store of buffer shards, keyed by (logical buffer, device).
//
// Thread-safe. An entry is created when dispatch allocates a node's outputs, before the
// producer has run: it holds the shard's future (ready when the producer completes) and the
// shard's memory reservation, so memory is accounted from allocation until Delete(). Deleting an
// entry whose producer has not finished is safe: whoever holds the futures keeps them alive.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pw/base/mutex.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/executor/device_buffer.h"
#include "pw/executor/device_memory.h"

namespace pw {

class ObjectStore {
 public:
  // Held, never read: granted memory, or a reservation still waiting (or failed).
  using Memory = std::variant<ReservationRef, Future<ReservationRef>>;
  struct Shard {
    Future<DeviceBufferRef> buffer;
    Memory memory;
    int64_t bytes = 0;
  };

  // Fails with AlreadyExists if the shard exists.
  absl::Status Put(BufferId id, DeviceId device, Shard shard);
  absl::StatusOr<Future<DeviceBufferRef>> Get(BufferId id, DeviceId device) const;
  // Like Get, but a shard not created yet is waited for: a peer may ask for a shard before this
  // host has processed the dispatch that creates it (hosts process their queues independently).
  Future<DeviceBufferRef> GetWhenCreated(BufferId id, DeviceId device);
  // Removes every shard of `id` on this host; returns how many.
  int Delete(BufferId id);
  // The shard of `id` on `device` (if any) failed: it holds no memory from now on (a reservation
  // still waiting is abandoned), though its entry stays until deleted.
  void DropMemory(BufferId id, DeviceId device);
  // Removes the shard of `id` on `device` (if any).
  void DeleteShard(BufferId id, DeviceId device);
  // Delete for many buffers under one lock.
  void DeleteMany(absl::Span<const BufferId> ids);
  // Ready when every shard of `id` on this host is ready (NotFound if there is none).
  Future<> Ready(BufferId id) const;
  // The host has failed: every shard is dropped (its memory released), peers waiting for a shard
  // get `why`, and from now on Put, Get and GetWhenCreated fail with `why` (a dead host's
  // store, as a killed worker process's would, holds and makes nothing).
  void Close(const absl::Status& why);

  size_t num_buffers() const;
  size_t num_shards() const;
  int64_t bytes() const;

 private:
  int DeleteAll(absl::Span<const BufferId> ids);
  mutable pw::Mutex mu_;
  // A host holds one shard per local device of a buffer: a few, kept inline.
  using Shards = absl::InlinedVector<std::pair<DeviceId, Shard>, 2>;
  absl::flat_hash_map<BufferId, Shards> buffers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<BufferId, DeviceId>, std::vector<Promise<DeviceBufferRef>>>
      waiting_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t shards_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // Close's `why`; OK while open.
};

}  // namespace pw
