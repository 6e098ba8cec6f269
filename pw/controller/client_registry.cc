#include "pw/controller/client_registry.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"

namespace pw {
namespace {

bool NameChar(char c) {
  return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' || c == ':';
}

// A client's own tenant: its name made a tenant name, and its id (client names repeat).
std::string OwnTenantName(const std::string& client, ClientId id) {
  std::string name;
  for (char c : client.substr(0, kMaxTenantName / 2)) name.push_back(NameChar(c) ? c : '_');
  return absl::StrCat(name.empty() ? "client" : name, ":", id.value());
}

}  // namespace

absl::Status ClientRegistry::CheckTenantName(const std::string& name) {
  if (name.empty() || name.size() > kMaxTenantName ||
      !std::all_of(name.begin(), name.end(), NameChar))
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant name '", name.substr(0, kMaxTenantName), name.size() > kMaxTenantName ? "..." : "",
        "': 1 to ", kMaxTenantName, " letters, digits and ._- please (and ':', which only an "
        "admin may use: clients' own tenants are <client>:<id>)"));
  return absl::OkStatus();
}

absl::Status ClientRegistry::CheckShare(double share, const std::string& tenant) {
  if (!std::isfinite(share) || share < Tenant::kMinShare || share > Tenant::kMaxShare)
    return absl::InvalidArgumentError(absl::StrCat("tenant '", tenant, "': share ", share,
                                                   " is outside ", Tenant::kMinShare, " ... ",
                                                   Tenant::kMaxShare));
  return absl::OkStatus();
}

ClientRegistry::TenantInfo& ClientRegistry::TenantLocked(const std::string& name) {
  TenantInfo& t = tenants_[name];
  if (t.tenant == nullptr) t.tenant = std::make_shared<Tenant>(next_tenant_++, name, 1.0);
  return t;
}

absl::StatusOr<ClientId> ClientRegistry::Connect(const std::string& name,
                                                 const ConnectOptions& options) {
  if (!options.tenant.empty()) PW_RETURN_IF_ERROR(CheckTenantName(options.tenant));
  // Names with ':' are clients' own tenants ("<client>:<id>"): a client naming one would join
  // another client's tenant and set its share, or take the name before that client connects.
  if (options.tenant.find(':') != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant name '", options.tenant, "': ':' is kept for clients' own tenants "
        "(<client>:<id>); name a shared tenant without it"));
  if (options.share != 0)
    PW_RETURN_IF_ERROR(CheckShare(options.share, options.tenant.empty() ? name : options.tenant));
  pw::MutexLock lock(&mu_);
  const ClientId id(next_client_++);
  TenantInfo& t = TenantLocked(options.tenant.empty() ? OwnTenantName(name, id) : options.tenant);
  if (options.share != 0 && !t.pinned) t.tenant->set_share(options.share);
  ++t.clients;
  clients_[id] = Client{name, t.tenant};
  return id;
}

absl::Status ClientRegistry::NotConnected(ClientId client) {
  return absl::UnauthenticatedError(absl::StrCat(client.ToString(), " is not connected"));
}

template <typename Clients>
auto* ClientRegistry::Live(Clients& clients, ClientId client) {
  auto it = clients.find(client);
  return it == clients.end() || it->second.leaving ? nullptr : &it->second;
}

absl::StatusOr<ClientRegistry::Visit> ClientRegistry::Enter(ClientId client) {
  pw::MutexLock lock(&mu_);
  Client* c = Live(clients_, client);
  if (c == nullptr) return NotConnected(client);
  ++c->visits;
  return Visit(this, client, c->tenant);
}

ClientRegistry::Visit::Visit(Visit&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)),
      client_(other.client_),
      tenant_(std::move(other.tenant_)) {}

ClientRegistry::Visit::~Visit() {
  if (registry_ != nullptr) registry_->Exit(client_);
}

void ClientRegistry::Exit(ClientId client) {
  absl::AnyInvocable<void() &&> cleanup;
  {
    pw::MutexLock lock(&mu_);
    auto it = clients_.find(client);
    if (it == clients_.end() || --it->second.visits > 0 || !it->second.leaving) return;
    cleanup = std::move(it->second.cleanup);
  }
  Forget(client, std::move(cleanup));
}

absl::Status ClientRegistry::Disconnect(ClientId client, absl::AnyInvocable<void() &&> cleanup) {
  {
    pw::MutexLock lock(&mu_);
    Client* c = Live(clients_, client);
    if (c == nullptr) return NotConnected(client);
    c->leaving = true;
    if (c->visits > 0) {
      c->cleanup = std::move(cleanup);  // The last visit's end runs it.
      return absl::OkStatus();
    }
  }
  Forget(client, std::move(cleanup));
  return absl::OkStatus();
}

void ClientRegistry::Forget(ClientId client, absl::AnyInvocable<void() &&> cleanup) {
  if (cleanup) std::move(cleanup)();  // Outside the lock: it may take others' locks.
  pw::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  auto t = tenants_.find(it->second.tenant->name());
  clients_.erase(it);
  if (t != tenants_.end() && --t->second.clients == 0 && !t->second.pinned) tenants_.erase(t);
}

absl::StatusOr<ClientRegistry::Quota> ClientRegistry::QuotaOf(ClientId client) const {
  pw::MutexLock lock(&mu_);
  const Client* c = Live(clients_, client);
  if (c == nullptr) return NotConnected(client);
  const Tenant& tenant = *c->tenant;
  auto t = tenants_.find(tenant.name());
  return Quota{tenant.id(), tenant.name(), t == tenants_.end() ? 0 : t->second.memory_quota};
}

absl::Status ClientRegistry::SetTenant(const TenantSettings& s) {
  PW_RETURN_IF_ERROR(CheckTenantName(s.name));
  if (s.share.has_value()) PW_RETURN_IF_ERROR(CheckShare(*s.share, s.name));
  if (s.memory_bytes.has_value() && *s.memory_bytes < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("tenant '", s.name, "': a negative memory quota"));
  pw::MutexLock lock(&mu_);
  if (!tenants_.contains(s.name) || !tenants_.at(s.name).pinned) {
    if (pinned_ >= kMaxPinnedTenants)
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", s.name, "': the cluster already has ", kMaxPinnedTenants,
          " tenants an admin set"));
  }
  TenantInfo& t = TenantLocked(s.name);
  if (!t.pinned) ++pinned_;
  t.pinned = true;
  if (s.share.has_value()) t.tenant->set_share(*s.share);
  if (s.memory_bytes.has_value()) t.memory_quota = *s.memory_bytes;
  return absl::OkStatus();
}

std::vector<ClientRegistry::TenantInfo> ClientRegistry::Tenants() const {
  pw::MutexLock lock(&mu_);
  std::vector<TenantInfo> out;
  for (const auto& [name, t] : tenants_) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const TenantInfo& a, const TenantInfo& b) {
    return a.tenant->name() < b.tenant->name();
  });
  return out;
}

size_t ClientRegistry::size() const {
  pw::MutexLock lock(&mu_);
  return clients_.size();
}

ClientRegistry::HandOff ClientRegistry::Queue(ClientId client, Future<> ready) {
  pw::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  Future<> previous = it == clients_.end() ? Future<>::Ready(absl::OkStatus())
                                           : it->second.last_handed;
  if (ready.IsReady() && previous.IsReady())
    return {Future<>::Ready(absl::OkStatus()), std::nullopt};
  HandOff h{JoinFutures({ready, previous}), Promise<>()};
  if (it != clients_.end()) it->second.last_handed = h.handed->future();
  return h;
}

}  // namespace pw
