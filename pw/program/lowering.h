// Validation and lowering of a ProgramIr into a sharded dataflow graph with physical placement.
//
// The lowered graph has one node per sharded computation: Arg nodes (the arguments, already
// resident), Compute nodes, Transfer nodes where a value must move between slices or shardings
// (ICI inside an island, DCN between islands), and a Result node. A->B on N shards each lowers to
// four nodes: Arg -> Compute(A) -> Compute(B) -> Result.
//
// Every invalid program gets an InvalidArgument/NotFound/PermissionDenied/Unavailable status
// naming the program and the node: unknown functions or slices, released slices, slices of
// other clients, shape/dtype/sharding mismatches, dangling references, cycles.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "pw/base/ids.h"
#include "pw/base/placement.h"
#include "pw/cluster/cluster_spec.h"
#include "pw/executor/function_def.h"
#include "pw/program/program_ir.h"
#include "pw/resource_manager/resource_manager.h"

namespace pw {

struct LoweredValue {
  std::shared_ptr<const Placement> placement;
  int arg = -1;  // Argument index, or -1 for values the program produces.
};

struct LoweredNode {
  enum class Kind { kArg, kCompute, kTransfer, kResult };
  Kind kind;
  std::string name;
  // Compute:
  FunctionId function;
  Placement slice;  // The slice it runs on (compute) or the destination (transfer).
  std::vector<int> inputs;   // Value indices.
  std::vector<int> outputs;  // Value indices.
  // Transfer:
  LinkClass link = LinkClass::kSameDevice;
  // Compute: intermediates this node reads last. They are read only by compute nodes (on the
  // devices holding them), so each device drops its shard once its shard of this node has run.
  // Arguments, results and values a transfer reads live until the run ends.
  std::vector<int> release;
};

struct LoweredProgram {
  std::string name;
  std::vector<LoweredValue> values;
  std::vector<LoweredNode> nodes;  // Topological order: Arg, then work, then Result.
  std::vector<int> outputs;        // Value indices of the program's results.
  // Peak bytes each device holds at once for the values the program produces (intermediates
  // count from their producer until their last reader, the rest until the run ends).
  absl::flat_hash_map<DeviceId, int64_t> device_bytes;
  int num_compute() const;
  int num_transfers() const;
  std::string ToString() const;
};

// What lowering needs from the runtime. Implemented by the controller; fakes in tests.
class LoweringContext {
 public:
  virtual ~LoweringContext() = default;
  virtual absl::StatusOr<SliceInfo> ResolveSlice(SliceId slice) const = 0;
  // The function's signature for a slice of `num_shards` devices.
  virtual absl::StatusOr<FunctionSignature> LoadSignature(FunctionId function,
                                                          int num_shards) const = 0;
};

// `args` holds the placement of each argument passed to this run.
// Checks that `global` sharded by `sharding` over `slice` gives shards a function taking (or
// returning) `shard_spec` can use: a valid spec and sharding, one shard per device of the slice,
// the same dtype and element count. Errors start with `where`. Used at lowering and at binding.
absl::Status CheckLayout(const std::string& where, const ArraySpec& global,
                         const Sharding& sharding, const ArraySpec& shard_spec,
                         const SliceInfo& slice);

absl::StatusOr<LoweredProgram> Lower(const ProgramIr& ir, const std::vector<Placement>& args,
                                     const LoweringContext& ctx);

// Placement of a binding's input or output on its slice.
Placement PlacementOn(const SliceInfo& slice, const ArraySpec& global, const Sharding& sharding);

}  // namespace pw
