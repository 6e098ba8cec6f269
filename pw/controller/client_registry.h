// ClientRegistry: the controller's clients and tenants.
//
// Thread-safe (one lock of its own). A client connects as a tenant (ConnectOptions): its own,
// named after it, unless it names one; clients of one tenant share its share of each island's
// device time and its memory quota. A tenant lives while it has clients, or while an admin's
// settings (SetTenant) pin it. Limits, checked here: tenant names (kMaxTenantName characters of
// letters, digits and ._-, and ':' from an admin only), shares (Tenant::kMinShare ... kMaxShare), at most kMaxPinnedTenants
// pinned tenants. A client may not name a tenant with ':' (those are clients' own); an admin may.
//
// A client's calls visit it (Enter .. the Visit's end); Disconnect refuses the client's new calls
// at once but frees its state (`cleanup`) only once no call of it is in progress, so a call past
// its check never leaves a slice, buffer, function, program or run behind for a client that is
// gone, nor meets its state half freed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
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

  // One call of a connected client in progress; the client's state stays while it lives.
  // Move-only; its end (destruction) may run the client's cleanup (see Disconnect).
  class Visit {
   public:
    Visit(Visit&& other) noexcept;
    Visit& operator=(Visit&&) = delete;
    ~Visit();
    const std::shared_ptr<const Tenant>& tenant() const { return tenant_; }

   private:
    friend class ClientRegistry;
    Visit(ClientRegistry* registry, ClientId client, std::shared_ptr<const Tenant> tenant)
        : registry_(registry), client_(client), tenant_(std::move(tenant)) {}
    ClientRegistry* registry_;  // Null once moved from.
    ClientId client_;
    std::shared_ptr<const Tenant> tenant_;
  };

  absl::StatusOr<ClientId> Connect(const std::string& name, const ConnectOptions& options);
  // Starts a call of the client: Unauthenticated naming it if it is not connected, or is
  // disconnecting.
  absl::StatusOr<Visit> Enter(ClientId client);
  // The client leaves: its new calls are refused from now on (Enter, QuotaOf);
  // `cleanup` (may be null) runs once none of its calls is in progress — at once, on this
  // thread, if none is, else on the thread that ends the last — and then the client is forgotten
  // (and its tenant, if that has no other clients and is not pinned). Never waits.
  absl::Status Disconnect(ClientId client, absl::AnyInvocable<void() &&> cleanup = nullptr);
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
    int64_t visits = 0;    // Calls in progress.
    bool leaving = false;  // Disconnect was called: `cleanup` runs after the last visit.
    absl::AnyInvocable<void() &&> cleanup;
  };
  // The visit of `client` ended.
  void Exit(ClientId client);
  // Runs the cleanup of a client that has left and no visit holds, then forgets it.
  void Forget(ClientId client, absl::AnyInvocable<void() &&> cleanup);
  // The client in `clients` (clients_, const or not), if it is connected and not leaving; else
  // null. Under mu_.
  template <typename Clients>
  static auto* Live(Clients& clients, ClientId client);
  static absl::Status NotConnected(ClientId client);
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
