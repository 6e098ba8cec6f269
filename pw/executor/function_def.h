// Compiled function definitions, one kind per backend. Plain data: registered with the controller
// and sent to every worker, which compiles them once per slice shape.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/base/shape.h"
#include "pw/executor/native_function.h"

namespace pw {

// An XLA computation as serialized StableHLO (a portable artifact from jax.export, or MLIR text)
// with its static per-shard input and output specs. Run by a PJRT plugin.
// `num_partitions` 1: the module computes one shard (compiled once, run on each device alone).
// N > 1: an SPMD module of N partitions with collectives across them (pmap-style: partition i
// holds shard i of every input and output as a [1, ...] block); it binds only to slices of N
// devices.
struct StableHloFunctionDef {
  std::string name;
  std::string module;
  std::vector<ArraySpec> inputs;
  std::vector<ArraySpec> outputs;
  int num_partitions = 1;
  // > 0: a per-shard module (num_partitions 1) whose collectives are the runtime's
  // (pw_* custom calls, pw/pjrt/runtime_collectives.h) over an axis of this many shards; it runs
  // only on slices of that many devices, which may span worker processes.
  int collective_axis_size = 0;
};

using FunctionDef = std::variant<NativeFunctionDef, StableHloFunctionDef>;

// What lowering needs of a function loaded for a slice: its name and per-shard specs.
struct FunctionSignature {
  std::string name;
  std::vector<ArraySpec> inputs;
  std::vector<ArraySpec> outputs;
  int64_t temp_bytes = 0;  // Executable::temp_bytes: a shard's intermediate values.
};

const std::string& FunctionName(const FunctionDef& def);
// About the bytes `def` holds (a module's text, a native function's ops and their attributes,
// names and specs): what keeping it registered costs (Controller::Options::definitions).
int64_t DefinitionBytes(const FunctionDef& def);
// Checks `def` for a slice of `num_shards` devices and returns its signature. Native functions are
// compiled against the kernel registry; StableHLO ones are checked for a module and valid specs
// (XLA compiles them on the workers).
absl::StatusOr<FunctionSignature> SignatureOf(const FunctionDef& def, int num_shards);

}  // namespace pw
