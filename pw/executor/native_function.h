// Native host-kernel compiled functions.
//
// A NativeFunctionDef is a static, straight-line program over per-shard arrays: inputs, then ops
// that each apply one registered kernel (by name) to earlier values, then outputs. Kernels are
// elementwise and scalar ops, matmul (OpenBLAS), and collectives across the slice (all-reduce,
// all-gather, reduce-scatter, all-to-all). Value i < inputs.size() is input i; value
// inputs.size() + k is the result of op k.
//
// CompileNative() checks the function against the kernel registry and infers every shape for a
// slice of `num_shards` devices, so a bad function fails before it runs, with an error naming the
// function, the op and the kernel. Every value's shape is checked (ArraySpec::Validate), and the
// executable's temp_bytes() is what its ops' results that are not outputs hold at once (all of
// them: a shard frees nothing before it ends), so a function whose intermediates could never fit
// a device is refused (at binding; a worker fails such a step) before anything is allocated.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/base/shape.h"
#include "pw/executor/executable.h"

namespace pw {

struct NativeOpDef {
  std::string kernel;
  std::vector<int> operands;             // Value indices.
  std::map<std::string, double> attrs;   // e.g. {"value": 2.0} for mul_scalar.
};

struct NativeFunctionDef {
  std::string name;
  std::vector<ArraySpec> inputs;  // Per shard.
  std::vector<NativeOpDef> ops;
  std::vector<int> outputs;       // Value indices.
};

// Builds a NativeFunctionDef; errors surface in CompileNative.
class NativeFunctionBuilder {
 public:
  explicit NativeFunctionBuilder(std::string name) { def_.name = std::move(name); }
  int Input(ArraySpec spec);
  int Op(std::string kernel, std::vector<int> operands, std::map<std::string, double> attrs = {});
  NativeFunctionDef Build(std::vector<int> outputs);

 private:
  NativeFunctionDef def_;
};

absl::StatusOr<ExecutableRef> CompileNative(const NativeFunctionDef& def, int num_shards);

// Names of every registered kernel, sorted.
std::vector<std::string> NativeKernelNames();

}  // namespace pw
