// BufferTable: the controller's index of logical sharded buffers, one reference count each.
//
// Thread-safe. A logical buffer is one array sharded over a slice; its shards live in the object
// stores of the hosts holding its devices. References are of two kinds: client handles (what a
// client may release) and pins (held by runs that read or produce the buffer). Handles are
// counted per client: the owner's, and those of clients it shared the array with (AddHandle), who
// may read it as their own. The buffer is freed (the caller deletes its shards on their hosts)
// when no client holds a handle and no run a pin. Each buffer's device bytes (every shard,
// replicas included) are charged to its owner while it exists, so the controller can hold each
// client to a quota (TryCharge).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "pw/base/mutex.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/base/placement.h"
#include "pw/base/shape.h"
#include "pw/base/sharding.h"

namespace pw {

struct LogicalBuffer {
  BufferId id;
  ClientId owner;
  std::shared_ptr<const Placement> placement;  // Shared with every buffer placed alike.
  // Ready when the buffer's producer is done: for a buffer a run produces, when that whole run
  // has finished (with the run's first error if it failed); for a put, when every shard is stored.
  Future<> ready;
};

class BufferTable {
 public:
  // What a client's arrays are held to: its own quota and its tenant's, shared with the
  // tenant's other clients (0: none).
  struct Quota {
    int64_t client_bytes = 0;
    int64_t tenant = -1;
    int64_t tenant_bytes = 0;
  };
  enum class Over { kNothing, kClientQuota, kTenantQuota };
  // Charges `bytes` to `client` (and its tenant) if both stay within their quotas; says which
  // would not (nothing charged) otherwise. Buffers created with these bytes (Create's `charged`)
  // give them back when freed. A client's tenant must not change while it holds bytes.
  Over TryCharge(ClientId client, int64_t bytes, const Quota& quota);
  // Registers a buffer with the given reference counts; assigns its id unless it has one (from
  // NewIds: a client-chosen output id), and returns it. `charged`:
  // bytes TryCharge charged its owner for it (returned when it is freed).
  BufferId Create(LogicalBuffer buffer, int client_refs, int pins, int64_t charged = 0);
  // The bytes of the buffers `client` owns that exist now (charged and not yet freed).
  int64_t HeldBytes(ClientId client) const;
  // The bytes a tenant's clients hold together.
  int64_t TenantHeldBytes(int64_t tenant) const;
  // `n` consecutive ids of buffers that are not listed (a run's intermediates, which no client
  // holds and its hosts delete themselves); returns the first.
  BufferId NewIds(int64_t n);
  // The buffer if it exists and `client` holds a handle to it; NotFound (naming it) if not;
  // DataLoss if its shards were lost (LoseHost).
  // `even_lost`: a lost buffer too (to drop handles to it).
  absl::StatusOr<LogicalBuffer> Lookup(ClientId client, BufferId id, bool even_lost = false) const;
  // Lookup and a pin in one step, so the buffer cannot be freed in between.
  absl::StatusOr<LogicalBuffer> LookupAndPin(ClientId client, BufferId id);
  // Drops one pin from each; returns buffers that are now unreferenced (removed from the table).
  std::vector<LogicalBuffer> Unpin(const std::vector<BufferId>& ids);
  // Drops one client handle; same return as Unpin. Errors for unknown, foreign or already
  // released handles, leaving the table unchanged.
  absl::StatusOr<std::vector<LogicalBuffer>> ReleaseHandle(ClientId client, BufferId id);
  // Drops every handle `client` holds; returns buffers now unreferenced.
  std::vector<LogicalBuffer> ReleaseClient(ClientId client);
  // Gives `client` one more handle to a buffer some client still holds (sharing: the caller has
  // checked it may); NotFound naming the buffer if none does.
  absl::StatusOr<LogicalBuffer> AddHandle(ClientId client, BufferId id);
  // Drops every handle `client` holds to `id` (a revoked share); returns buffers now freed.
  std::vector<LogicalBuffer> DropHandles(ClientId client, BufferId id);
  // `host` failed: every buffer with a shard there is lost (a replicated one too, though other
  // hosts hold its regions). Lookup and LookupAndPin of one fail from now on (DataLoss:
  // "<buffer> was lost: <why>"); its handles are released as before.
  // Returns how many were lost.
  int LoseHost(HostId host, const absl::Status& why);
  size_t size() const;

 private:
  struct Entry {
    LogicalBuffer buffer;
    absl::flat_hash_map<ClientId, int> handles;  // Per client holding any; none: absent.
    int pins = 0;
    int64_t charged = 0;
    absl::Status lost;  // LoseHost's error; OK while its shards exist.
    bool unreferenced() const { return handles.empty() && pins == 0; }
  };
  // Removes the entry and returns its owner's charge; the buffer moves to `freed`.
  void Remove(absl::flat_hash_map<BufferId, Entry>::iterator it, std::vector<LogicalBuffer>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of a handle `client` holds, or NotFound / PermissionDenied naming the buffer.
  absl::StatusOr<Entry*> FindHandle(ClientId client, BufferId id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable pw::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<BufferId, Entry> entries_ ABSL_GUARDED_BY(mu_);
  struct Held {
    int64_t bytes = 0;
    int64_t tenant = -1;
  };
  absl::flat_hash_map<ClientId, Held> held_ ABSL_GUARDED_BY(mu_);  // Charged bytes; none: absent.
  absl::flat_hash_map<int64_t, int64_t> tenant_held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw
