#include "pw/object_store/object_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace pw {

absl::Status ObjectStore::Put(BufferId id, DeviceId device, Shard shard) {
  std::vector<Promise<DeviceBufferRef>> waiters;
  Future<DeviceBufferRef> buffer = shard.buffer;
  {
    pw::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    auto& shards = buffers_[id];
    for (const auto& [d, _] : shards) {
      if (d == device)
        return absl::AlreadyExistsError(
            absl::StrCat(id.ToString(), " already has a shard on ", device.ToString()));
    }
    bytes_ += shard.bytes;
    ++shards_;
    shards.emplace_back(device, std::move(shard));
    if (!waiting_.empty()) {
      auto it = waiting_.find(std::make_pair(id, device));
      if (it != waiting_.end()) {
        waiters = std::move(it->second);
        waiting_.erase(it);
      }
    }
  }
  for (auto& w : waiters) {
    buffer.OnReady([w = std::move(w)](const absl::StatusOr<DeviceBufferRef>& b) mutable {
      w.Set(b);
    });
  }
  return absl::OkStatus();
}

Future<DeviceBufferRef> ObjectStore::GetWhenCreated(BufferId id, DeviceId device) {
  pw::MutexLock lock(&mu_);
  if (!closed_.ok()) return Future<DeviceBufferRef>::Ready(closed_);
  auto it = buffers_.find(id);
  if (it != buffers_.end()) {
    for (const auto& [d, shard] : it->second)
      if (d == device) return shard.buffer;
  }
  Promise<DeviceBufferRef> p;
  Future<DeviceBufferRef> f = p.future();
  waiting_[std::make_pair(id, device)].push_back(std::move(p));
  return f;
}

absl::StatusOr<Future<DeviceBufferRef>> ObjectStore::Get(BufferId id, DeviceId device) const {
  pw::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  auto it = buffers_.find(id);
  if (it == buffers_.end())
    return absl::NotFoundError(absl::StrCat(id.ToString(), " is not in this host's object store"));
  for (const auto& [d, shard] : it->second)
    if (d == device) return shard.buffer;
  return absl::NotFoundError(absl::StrCat(id.ToString(), " has no shard on ", device.ToString()));
}

int ObjectStore::Delete(BufferId id) {
  const BufferId ids[] = {id};
  return DeleteAll(ids);
}

void ObjectStore::DropMemory(BufferId id, DeviceId device) {
  Memory dropped;  // Released (or its reservation abandoned) after the lock is released.
  pw::MutexLock lock(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  for (auto& [d, shard] : it->second) {
    if (d != device) continue;
    dropped = std::exchange(shard.memory, ReservationRef());
    break;
  }
}

void ObjectStore::DeleteShard(BufferId id, DeviceId device) {
  Shard dropped;  // Destroyed (memory released) after the lock is released.
  pw::MutexLock lock(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  Shards& shards = it->second;
  for (auto s = shards.begin(); s != shards.end(); ++s) {
    if (s->first != device) continue;
    bytes_ -= s->second.bytes;
    --shards_;
    dropped = std::move(s->second);
    shards.erase(s);
    break;
  }
  if (shards.empty()) buffers_.erase(it);
}

void ObjectStore::DeleteMany(absl::Span<const BufferId> ids) { DeleteAll(ids); }

int ObjectStore::DeleteAll(absl::Span<const BufferId> ids) {
  std::vector<Shards> dropped;  // Destroyed (memory released) after the lock is released.
  std::vector<std::pair<BufferId, Promise<DeviceBufferRef>>> orphans;
  int count = 0;
  {
    pw::MutexLock lock(&mu_);
    for (BufferId id : ids) {
      // Peers waiting for a shard of `id` that was never created here will not get one.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (it->first.first == id) {
          for (auto& p : it->second) orphans.emplace_back(id, std::move(p));
          waiting_.erase(it++);
        } else {
          ++it;
        }
      }
      auto it = buffers_.find(id);
      if (it == buffers_.end()) continue;
      for (const auto& [d, s] : it->second) bytes_ -= s.bytes;
      shards_ -= it->second.size();
      count += static_cast<int>(it->second.size());
      dropped.push_back(std::move(it->second));
      buffers_.erase(it);
    }
  }
  for (auto& [id, p] : orphans)
    p.Set(absl::NotFoundError(absl::StrCat(id.ToString(), " was deleted before it was created")));
  return count;
}

void ObjectStore::Close(const absl::Status& why) {
  const absl::Status closed =
      why.ok() ? absl::UnavailableError("the object store was closed") : why;
  absl::flat_hash_map<BufferId, Shards> dropped;  // Destroyed (memory released) unlocked.
  absl::flat_hash_map<std::pair<BufferId, DeviceId>, std::vector<Promise<DeviceBufferRef>>> waiting;
  {
    pw::MutexLock lock(&mu_);
    if (!closed_.ok()) return;
    closed_ = closed;
    dropped.swap(buffers_);
    waiting.swap(waiting_);
    bytes_ = 0;
    shards_ = 0;
  }
  for (auto& [key, promises] : waiting)
    for (auto& p : promises) p.Set(closed);
}

Future<> ObjectStore::Ready(BufferId id) const {
  std::vector<Future<>> fs;
  {
    pw::MutexLock lock(&mu_);
    if (!closed_.ok()) return Future<>::Ready(closed_);
    auto it = buffers_.find(id);
    if (it == buffers_.end())
      return Future<>::Ready(
          absl::NotFoundError(absl::StrCat(id.ToString(), " is not in this host's object store")));
    for (const auto& [d, s] : it->second) fs.push_back(AsStatusFuture(s.buffer));
  }
  return JoinFutures(fs);
}

size_t ObjectStore::num_buffers() const {
  pw::MutexLock lock(&mu_);
  return buffers_.size();
}
size_t ObjectStore::num_shards() const {
  pw::MutexLock lock(&mu_);
  return shards_;
}
int64_t ObjectStore::bytes() const {
  pw::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace pw
