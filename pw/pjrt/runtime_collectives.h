// Runtime collectives for XLA functions: the collectives of a pw.pmap function (psum, pmax, pmin,
// all_gather, psum_scatter, all_to_all, ppermute, axis_index) as typed-FFI custom calls whose
// handlers run in this process and meet through the runtime's own `Collectives`, so a function's
// shards may live in different worker processes, and a rendezvous can be aborted (a removed
// device, a failed peer) instead of waiting inside XLA.
//
// The client (python/pathways/_collectives.py) exports such a function as one single-device
// module per shard, in which each collective is `stablehlo.custom_call @pw_<kind>` (api_version 4)
// with static attributes: `op_id` (the collective's index in the module), `groups` and
// `group_size` (which ranks meet: CollectiveLaunch::GroupOf; "rank" and "n" below are a shard's
// position in its group and the group's size) and per kind
// `reduction` (kSum/kMax/kMin) or `pairs` (ppermute's source/destination pairs, flattened).
// Buffers are flat, rank-major, and the layout work (moving axes, tiling) stays in the module:
//   pw_all_reduce      x[...]   -> y[...]    y = reduce over ranks of x
//   pw_all_gather      x[...]   -> y[n, ...] y[i] = x of rank i
//   pw_reduce_scatter  x[n, c]  -> y[c]      y = reduce over ranks i of x_i[rank]
//   pw_all_to_all      x[n, c]  -> y[n, c]   y[i] = x_i[rank]
//   pw_ppermute        x[...]   -> y[...]    y = x of the rank that sends to this one, else 0
//   pw_axis_index      ()       -> s32[]     this shard's rank
//   pw_after           x[...]   -> y[...]    y = x (no rendezvous)
// Every call but pw_axis_index takes a second operand, `after`, that it does not read: the
// previous collective's output (an empty array for the first). XLA's CPU runtime runs
// independent side-effecting custom calls in whatever order they become ready, which differs
// between shards, and a shard blocked in one rendezvous cannot start the next: shards waiting in
// different collectives deadlocked. Through `after`, a module's collectives run in one order
// (the trace's) on every shard; a loop or branch holding collectives takes one of its operands
// through pw_after, so it starts after the collectives before it.
//
// Each launched shard passes a CollectiveLaunch as FFI user data of its PJRT execute context;
// the handlers find it there (never in thread-local state), so any plugin thread may run them.
// The collective key is (run, node, op_id << 20 | invocation of that op in this launch): loops
// run one op many times, and every shard of a launch runs the same module.
//
// Declared here because no installed header has it: the plugin's PJRT_FFI_Extension (version 3
// of pjrt_c_api_ffi_extension.h: Type_Register with a type-info pointer, UserData without a
// deleter, Register_Handler without an api_version). Its struct_size is checked at load against
// ours, and the plugin's own argument-struct names are checked in pjrt_plugin_test.
//
// Thread-safety: registration is thread-safe and runs once per plugin; a CollectiveLaunch is used
// by the threads that run one shard's computation.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"
#include "pw/executor/collectives.h"
#include "pw/pjrt/pjrt_plugin.h"

namespace pw::pjrt {

// Reductions, as the `reduction` attribute spells them.
enum class Reduction : int64_t { kSum = 0, kMax = 1, kMin = 2 };

// What one shard's collectives need. Lives until the shard's computation has run.
class CollectiveLaunch {
 public:
  CollectiveLaunch(CollectiveKey key, int rank, absl::Span<const DeviceId> devices,
                   Collectives* collectives)
      : key_(key), rank_(rank), devices_(devices), collectives_(collectives) {}

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(devices_.size()); }
  absl::Span<const DeviceId> devices() const { return devices_; }
  Collectives* collectives() const { return collectives_; }

  // The shards one collective meets with: a collective over some axes of a mesh meets in groups
  // (the ranks that differ only along those axes), given as the `groups` attribute: every rank
  // of the launch once, group after group, each `group_size` long, in the order the axes number
  // them (the whole launch, 0..n-1, when it is over every axis).
  struct Group {
    int index = 0;  // Which group (CollectiveKey::group).
    int rank = 0;   // This shard's position in it.
    std::vector<DeviceId> devices;
    int size() const { return static_cast<int>(devices.size()); }
  };
  // This shard's group; InvalidArgument naming what is wrong if `groups` is not a partition of
  // the launch's ranks into groups of `group_size`.
  absl::StatusOr<Group> GroupOf(absl::Span<const int64_t> groups, int64_t group_size) const;
  // The key of the next invocation of op `op_id` in this launch, for group `group`.
  CollectiveKey NextKey(int64_t op_id, int group) ABSL_LOCKS_EXCLUDED(mu_);
  // "run:R node N op K": where a collective that failed was.
  std::string Where(const CollectiveKey& key) const;

 private:
  const CollectiveKey key_;
  const int rank_;
  const absl::Span<const DeviceId> devices_;
  Collectives* const collectives_;
  pw::Mutex mu_;
  absl::flat_hash_map<int64_t, int32_t> invocations_ ABSL_GUARDED_BY(mu_);
};

// Registers the pw_* handlers and the CollectiveLaunch user-data type with `plugin`'s FFI
// extension for `platform` (the client's platform name), once per plugin; later calls return
// the first call's status. FailedPrecondition if the plugin has no (compatible) FFI extension.
absl::Status RegisterRuntimeCollectives(const PjrtPlugin& plugin, absl::string_view platform);

// Adds `launch` to `context` as the user data the handlers read.
absl::Status AddCollectiveLaunch(const PjrtPlugin& plugin, PJRT_ExecuteContext* context,
                                 CollectiveLaunch* launch);

}  // namespace pw::pjrt
