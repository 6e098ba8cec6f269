// PjrtBackend: the PJRT client behind a set of runtime devices, with its compile cache.
//
// One backend serves every worker of a process that shares it (the embedded cluster gives all its
// hosts one backend, so an SPMD function's partitions on different in-process hosts are devices of
// one PJRT client and meet in its collectives); a worker process has its own. The client is created
// on first use with one PJRT device per runtime device (the CPU plugin's `cpu_device_count`); a
// plugin without that option (a GPU plugin) keeps its own devices, and runtime devices share them
// round-robin (runtime device i of the backend -> PJRT device i mod count).
// Executables are cached by fingerprint: the module bytes, the declared PJRT input specs and the
// partition placement, so workers sharing a backend compile a function for a slice once. The cache
// holds an executable only while someone else does (its workers' functions): once the last
// function using it is unloaded it is freed, and its entry goes at the next compile.
//
// Thread-safe. Each fingerprint compiles once: concurrent callers for it wait for the first,
// while other functions compile at the same time (no lock is held during a compile).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_set.h"
#include "absl/status/statusor.h"
#include "pw/base/future.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"
#include "pw/pjrt/pjrt_plugin.h"

namespace pw::pjrt {

class PjrtBackend {
 public:
  PjrtBackend(std::string plugin_path, std::vector<DeviceId> devices);

  const std::string& plugin_path() const { return plugin_path_; }
  // The client (loading the plugin and creating it on first use).
  absl::StatusOr<std::shared_ptr<const PjrtClient>> Client() ABSL_LOCKS_EXCLUDED(mu_);
  // PJRT device index of runtime device `d`, or -1 if `d` is not one of this backend's devices.
  // Valid once Client() has succeeded.
  int IndexOf(DeviceId d) const;
  // Compiles (or finds in the cache) `module` with per-partition PJRT input specs `inputs`;
  // `placement` as in PjrtClient::Compile (empty: portable single-device executable).
  absl::StatusOr<std::shared_ptr<const PjrtExecutable>> Compile(const std::string& name,
                                                                const std::string& module,
                                                                std::vector<ArraySpec> inputs,
                                                                std::vector<int> placement)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A stable key for buffers staged into this backend's client on `device_index` as `spec`
  // (DeviceBuffer::Mirror).
  const void* StagingKey(int device_index, const ArraySpec& spec) ABSL_LOCKS_EXCLUDED(keys_mu_);
  // Whether functions with runtime collectives (runtime_collectives.h) can run here: OK once
  // their handlers are registered with the client's plugin.
  absl::Status RuntimeCollectives() ABSL_LOCKS_EXCLUDED(mu_);
  // Number of compiles done (cache misses).
  int64_t num_compiles() const ABSL_LOCKS_EXCLUDED(mu_);
  // Executables cached (compiled or compiling, and still held by someone).
  size_t num_cached() const ABSL_LOCKS_EXCLUDED(mu_);
  // For tests: called with the function's name on the compiling thread before each compile (a
  // cache miss), outside any lock.
  void SetCompileHookForTesting(std::function<void(const std::string&)> hook)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<std::shared_ptr<const PjrtClient>> ClientLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string plugin_path_;
  const absl::flat_hash_map<DeviceId, int> index_;
  const int num_devices_;
  std::atomic<int> pjrt_devices_{1};  // Set when the client is created.
  mutable pw::Mutex mu_;
  std::shared_ptr<const PjrtClient> client_ ABSL_GUARDED_BY(mu_);
  // By fingerprint: a pending future while its first caller compiles it (outside mu_), then a
  // weak reference.
  struct Cached {
    std::optional<Future<std::shared_ptr<const PjrtExecutable>>> compiling;
    std::weak_ptr<const PjrtExecutable> compiled;
  };
  absl::flat_hash_map<std::string, Cached> cache_ ABSL_GUARDED_BY(mu_);
  int64_t num_compiles_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status collectives_status_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> compile_hook_ ABSL_GUARDED_BY(mu_);
  // Its own lock: staging on a device thread must not wait behind a compile holding mu_.
  pw::Mutex keys_mu_;
  absl::node_hash_set<std::string> staging_keys_ ABSL_GUARDED_BY(keys_mu_);
};

}  // namespace pw::pjrt
