// ClientRegistry: the controller's clients and tenants.
//
// Thread-safe (one lock of its own). A client connects as a tenant (ConnectOptions): its own,
// named after it, unless it names one; clients of one tenant share its share of each island's
// device time and its memory quota. A tenant lives while it has clients, or while an admin's
// settings (SetTenant) pin it. Limits, checked here: tenant names (kMaxTenantName characters of
// letters, digits and ._-:), shares (Tenant::kMinShare ... kMaxShare), at most kMaxPinnedTenants
// pinned tenants.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"
#include "pw/scheduler/tenant.h"
#include "pw/transport/controller_interface.h"

namespace pw {

class ClientRegistry {
 public:
  static constexpr int kMaxPinnedTenants = 4096;

  struct TenantInfo {
    std::shared_ptr<Tenant> tenant;
    bool pinned = false;
    int64_t memory_quota = 0;  // 0: none.
    int clients = 0;
  };

  absl::StatusOr<ClientId> Connect(const std::string& name, const ConnectOptions& options);
  // Forgets the client (and its tenant, if that has no other clients and is not pinned).
  absl::Status Disconnect(ClientId client);
  // Unauthenticated naming the client if it is not connected.
  absl::Status Check(ClientId client) const;
  absl::StatusOr<std::shared_ptr<const Tenant>> TenantOf(ClientId client) const;
  // The client's tenant's id and memory quota (0: none), for charging its arrays.
  struct Quota {
    int64_t tenant = -1;
    std::string name;
    int64_t bytes = 0;
  };
  absl::StatusOr<Quota> QuotaOf(ClientId client) const;
  absl::Status SetTenant(const TenantSettings& settings);
  std::vector<TenantInfo> Tenants() const;
  size_t size() const;

  // Runs of a client reach the schedulers in its submission order. A run that must wait first
  // (for another client's array still being made) is handed to the schedulers once `ready` (its
  // own wait) and the client's previous waiting run's hand-off are both done: returns the future
  // of that moment, which the caller completes by handing the run over and then setting the
  // returned promise. A client with no run waiting gets a ready future and no promise.
  struct HandOff {
    Future<> go;               // When the run may be handed over.
    std::optional<Promise<>> handed;  // Set once it has been (null when nothing waited).
  };
  HandOff Queue(ClientId client, Future<> ready);

 private:
  struct Client {
    std::string name;
    std::shared_ptr<Tenant> tenant;
    Future<> last_handed = Future<>::Ready(absl::OkStatus());
  };
  static absl::Status CheckTenantName(const std::string& name);
  static absl::Status CheckShare(double share, const std::string& tenant);
  TenantInfo& TenantLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable pw::Mutex mu_;
  int64_t next_client_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_tenant_ ABSL_GUARDED_BY(mu_) = 0;
  int pinned_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<ClientId, Client> clients_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, TenantInfo> tenants_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw
