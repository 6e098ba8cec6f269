#include "pw/object_store/buffer_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"

namespace pw {

namespace {
bool Exceeds(int64_t held, int64_t bytes, int64_t quota) {
  return quota > 0 && (bytes > quota || held > quota - bytes);
}
}  // namespace

BufferTable::Over BufferTable::TryCharge(ClientId client, int64_t bytes, const Quota& quota) {
  pw::MutexLock lock(&mu_);
  auto it = held_.find(client);
  const int64_t held = it == held_.end() ? 0 : it->second.bytes;
  if (Exceeds(held, bytes, quota.client_bytes)) return Over::kClientQuota;
  auto t = tenant_held_.find(quota.tenant);
  if (Exceeds(t == tenant_held_.end() ? 0 : t->second, bytes, quota.tenant_bytes))
    return Over::kTenantQuota;
  if (bytes > 0) {
    held_[client] = {held + bytes, quota.tenant};
    tenant_held_[quota.tenant] += bytes;
  }
  return Over::kNothing;
}

int64_t BufferTable::HeldBytes(ClientId client) const {
  pw::MutexLock lock(&mu_);
  auto it = held_.find(client);
  return it == held_.end() ? 0 : it->second.bytes;
}

int64_t BufferTable::TenantHeldBytes(int64_t tenant) const {
  pw::MutexLock lock(&mu_);
  auto it = tenant_held_.find(tenant);
  return it == tenant_held_.end() ? 0 : it->second;
}

BufferId BufferTable::Create(LogicalBuffer buffer, int client_refs, int pins, int64_t charged) {
  pw::MutexLock lock(&mu_);
  if (!buffer.id.valid()) buffer.id = BufferId(next_id_++);
  BufferId id = buffer.id;
  Entry e{std::move(buffer), {}, pins, charged};
  if (client_refs > 0) e.handles[e.buffer.owner] = client_refs;
  entries_.emplace(id, std::move(e));
  return id;
}

void BufferTable::Remove(absl::flat_hash_map<BufferId, Entry>::iterator it,
                         std::vector<LogicalBuffer>* freed) {
  Entry& e = it->second;
  if (e.charged > 0) {
    if (auto h = held_.find(e.buffer.owner); h != held_.end()) {
      if (auto t = tenant_held_.find(h->second.tenant);
          t != tenant_held_.end() && (t->second -= e.charged) <= 0)
        tenant_held_.erase(t);
      if ((h->second.bytes -= e.charged) <= 0) held_.erase(h);
    }
  }
  freed->push_back(std::move(e.buffer));
  entries_.erase(it);
}

BufferId BufferTable::NewIds(int64_t n) {
  pw::MutexLock lock(&mu_);
  const BufferId first(next_id_);
  next_id_ += n;
  return first;
}

absl::StatusOr<BufferTable::Entry*> BufferTable::FindHandle(ClientId client, BufferId id) const {
  auto it = entries_.find(id);
  // Another client's buffer reads as one that does not exist: ids reveal nothing.
  if (it == entries_.end() || !it->second.handles.contains(client))
    return absl::NotFoundError(absl::StrCat(
        id.ToString(), " is not an array of this client (never made, released, or shared with "
                       "it by a share since revoked)"));
  return const_cast<Entry*>(&it->second);
}

absl::StatusOr<LogicalBuffer> BufferTable::Lookup(ClientId client, BufferId id,
                                                 bool even_lost) const {
  pw::MutexLock lock(&mu_);
  PW_ASSIGN_OR_RETURN(Entry * e, FindHandle(client, id));
  if (!even_lost) PW_RETURN_IF_ERROR(e->lost);
  return e->buffer;
}

absl::StatusOr<LogicalBuffer> BufferTable::LookupAndPin(ClientId client, BufferId id) {
  pw::MutexLock lock(&mu_);
  PW_ASSIGN_OR_RETURN(Entry * e, FindHandle(client, id));
  PW_RETURN_IF_ERROR(e->lost);
  e->pins++;
  return e->buffer;
}

int BufferTable::LoseHost(HostId host, const absl::Status& why) {
  int lost = 0;
  pw::MutexLock lock(&mu_);
  for (auto& [id, e] : entries_) {
    if (!e.lost.ok() || e.buffer.placement == nullptr) continue;
    const std::vector<HostId>& hosts = e.buffer.placement->hosts;
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) continue;
    e.lost = absl::DataLossError(absl::StrCat(id.ToString(), " was lost: ", why.message()));
    ++lost;
  }
  return lost;
}

std::vector<LogicalBuffer> BufferTable::Unpin(const std::vector<BufferId>& ids) {
  std::vector<LogicalBuffer> freed;
  pw::MutexLock lock(&mu_);
  for (BufferId id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    if (--it->second.pins == 0 && it->second.unreferenced()) Remove(it, &freed);
  }
  return freed;
}

absl::StatusOr<std::vector<LogicalBuffer>> BufferTable::ReleaseHandle(ClientId client,
                                                                      BufferId id) {
  pw::MutexLock lock(&mu_);
  PW_ASSIGN_OR_RETURN(Entry * e, FindHandle(client, id));
  std::vector<LogicalBuffer> freed;
  if (--e->handles[client] == 0) e->handles.erase(client);
  if (e->unreferenced()) Remove(entries_.find(id), &freed);
  return freed;
}

std::vector<LogicalBuffer> BufferTable::ReleaseClient(ClientId client) {
  std::vector<LogicalBuffer> freed;
  pw::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& e = it->second;
    if (e.handles.erase(client) > 0 && e.unreferenced()) {
      Remove(it++, &freed);
    } else {
      ++it;
    }
  }
  return freed;
}

absl::StatusOr<LogicalBuffer> BufferTable::AddHandle(ClientId client, BufferId id) {
  pw::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.handles.empty())
    return absl::NotFoundError(absl::StrCat(
        "the shared array (", id.ToString(), ") is gone: every client holding it released it"));
  it->second.handles[client]++;
  return it->second.buffer;
}

std::vector<LogicalBuffer> BufferTable::DropHandles(ClientId client, BufferId id) {
  std::vector<LogicalBuffer> freed;
  pw::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.handles.erase(client) > 0 && it->second.unreferenced())
    Remove(it, &freed);
  return freed;
}

size_t BufferTable::size() const {
  pw::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace pw
