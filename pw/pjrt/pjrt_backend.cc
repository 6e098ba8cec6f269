#include "pw/pjrt/pjrt_backend.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/pjrt/runtime_collectives.h"

namespace pw::pjrt {

namespace {
absl::flat_hash_map<DeviceId, int> IndexDevices(const std::vector<DeviceId>& devices) {
  absl::flat_hash_map<DeviceId, int> index;
  for (size_t i = 0; i < devices.size(); ++i) index.emplace(devices[i], static_cast<int>(i));
  return index;
}
}  // namespace

PjrtBackend::PjrtBackend(std::string plugin_path, std::vector<DeviceId> devices)
    : plugin_path_(std::move(plugin_path)),
      index_(IndexDevices(devices)),
      num_devices_(static_cast<int>(devices.size())) {}

int PjrtBackend::IndexOf(DeviceId d) const {
  auto it = index_.find(d);
  return it == index_.end() ? -1 : it->second % pjrt_devices_.load(std::memory_order_acquire);
}

absl::StatusOr<std::shared_ptr<const PjrtClient>> PjrtBackend::Client() {
  pw::MutexLock lock(&mu_);
  return ClientLocked();
}

absl::StatusOr<std::shared_ptr<const PjrtClient>> PjrtBackend::ClientLocked() {
  if (client_ != nullptr) return client_;
  if (plugin_path_.empty())
    return absl::FailedPreconditionError("no PJRT plugin is configured for StableHLO functions");
  PW_ASSIGN_OR_RETURN(auto plugin, PjrtPlugin::Load(plugin_path_));
  auto client = PjrtClient::Create(plugin, num_devices_);
  if (!client.ok()) {
    // Not a CPU plugin (no cpu_device_count option): use its own devices.
    auto plain = PjrtClient::Create(plugin, 0);
    if (!plain.ok()) {
      return absl::Status(plain.status().code(),
                          absl::StrCat(plain.status().message(), " (asking for ", num_devices_,
                                       " CPU devices: ", client.status().message(), ")"));
    }
    client = std::move(plain);
  }
  pjrt_devices_.store(std::max(1, std::min(num_devices_, (*client)->num_devices())),
                      std::memory_order_release);
  collectives_status_ = RegisterRuntimeCollectives(*plugin, (*client)->platform_name());
  client_ = *std::move(client);
  return client_;
}

absl::StatusOr<std::shared_ptr<const PjrtExecutable>> PjrtBackend::Compile(
    const std::string& name, const std::string& module, std::vector<ArraySpec> inputs,
    std::vector<int> placement) {
  // Fingerprint: everything the compiled code depends on, exactly (no hash collisions).
  std::string key = absl::StrCat(name, "\n", placement.size(), ":");
  for (int p : placement) absl::StrAppend(&key, p, ",");
  for (const ArraySpec& s : inputs) absl::StrAppend(&key, s.ToString(), ";");
  absl::StrAppend(&key, "|", module);
  std::shared_ptr<const PjrtClient> client;
  Promise<std::shared_ptr<const PjrtExecutable>> compiling;
  std::optional<Future<std::shared_ptr<const PjrtExecutable>>> cached;
  std::function<void(const std::string&)> hook;
  {
    pw::MutexLock lock(&mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      if (it->second.compiling.has_value()) {
        cached = it->second.compiling;
      } else if (std::shared_ptr<const PjrtExecutable> exe = it->second.compiled.lock()) {
        return exe;
      }
    }
    if (!cached.has_value()) {
      PW_ASSIGN_OR_RETURN(client, ClientLocked());
      ++num_compiles_;
      // Entries no one holds any more go (their keys hold whole modules).
      absl::erase_if(cache_, [](const auto& kv) {
        return !kv.second.compiling.has_value() && kv.second.compiled.expired();
      });
      cache_[key] = Cached{compiling.future(), {}};
      hook = compile_hook_;
    }
  }
  if (cached.has_value()) return cached->Await();  // Being compiled by another caller.
  if (hook) hook(name);
  // Outside mu_: other functions compile (and the client is used) meanwhile.
  absl::StatusOr<std::unique_ptr<PjrtExecutable>> exe =
      client->Compile(name, module, std::move(inputs), placement);
  if (!exe.ok()) {
    pw::MutexLock lock(&mu_);
    cache_.erase(key);  // Errors are not cached: a later caller tries again.
    compiling.Set(exe.status());
    return exe.status();
  }
  std::shared_ptr<const PjrtExecutable> ready = *std::move(exe);
  {
    pw::MutexLock lock(&mu_);
    cache_[key] = Cached{std::nullopt, ready};
  }
  compiling.Set(ready);
  return ready;
}

size_t PjrtBackend::num_cached() const {
  pw::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, c] : cache_) n += c.compiling.has_value() || !c.compiled.expired();
  return n;
}

const void* PjrtBackend::StagingKey(int device_index, const ArraySpec& spec) {
  pw::MutexLock lock(&keys_mu_);
  return &*staging_keys_.insert(absl::StrCat(device_index, "/", spec.ToString())).first;
}

absl::Status PjrtBackend::RuntimeCollectives() {
  pw::MutexLock lock(&mu_);
  PW_RETURN_IF_ERROR(ClientLocked().status());
  return collectives_status_;
}

void PjrtBackend::SetCompileHookForTesting(std::function<void(const std::string&)> hook) {
  pw::MutexLock lock(&mu_);
  compile_hook_ = std::move(hook);
}

int64_t PjrtBackend::num_compiles() const {
  pw::MutexLock lock(&mu_);
  return num_compiles_;
}

}  // namespace pw::pjrt
