#include "pw/executor/native_function.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pw/base/status_macros.h"
#include "pw/executor/native_kernels.h"

namespace pw {

int NativeFunctionBuilder::Input(ArraySpec spec) {
  def_.inputs.push_back(std::move(spec));
  return static_cast<int>(def_.inputs.size()) - 1;
}

int NativeFunctionBuilder::Op(std::string kernel, std::vector<int> operands,
                              std::map<std::string, double> attrs) {
  def_.ops.push_back({std::move(kernel), std::move(operands), std::move(attrs)});
  return static_cast<int>(def_.inputs.size() + def_.ops.size()) - 1;
}

NativeFunctionDef NativeFunctionBuilder::Build(std::vector<int> outputs) {
  def_.outputs = std::move(outputs);
  return def_;
}

namespace {

struct CompiledOp {
  const native::KernelDef* kernel;
  std::vector<int> operands;
  native::Attrs attrs;
  ArraySpec out;
};

class NativeExecutable final : public Executable {
 public:
  NativeExecutable(std::string name, int num_shards, std::vector<ArraySpec> inputs,
                   std::vector<CompiledOp> ops, std::vector<int> outputs,
                   std::vector<ArraySpec> output_specs, int64_t temp_bytes)
      : name_(std::move(name)),
        num_shards_(num_shards),
        inputs_(std::move(inputs)),
        ops_(std::move(ops)),
        outputs_(std::move(outputs)),
        output_specs_(std::move(output_specs)),
        temp_bytes_(temp_bytes) {
    for (size_t j = 0; j < outputs_.size(); ++j)
      last_use_.push_back(std::find(outputs_.begin() + j + 1, outputs_.end(), outputs_[j]) ==
                          outputs_.end());
  }

  const std::string& name() const override { return name_; }
  int num_shards() const override { return num_shards_; }
  const std::vector<ArraySpec>& input_specs() const override { return inputs_; }
  const std::vector<ArraySpec>& output_specs() const override { return output_specs_; }
  int64_t temp_bytes() const override { return temp_bytes_; }

  Future<std::vector<DeviceBufferRef>> ExecuteShard(const ShardLaunch& launch) const override {
    return Future<std::vector<DeviceBufferRef>>::Ready(Run(launch));
  }
  // Runs the kernels on the calling (device) thread before returning.
  Executable::Run Launch(const ShardLaunch& launch) const override {
    Executable::Run run;
    run.ran = Run(launch);
    return run;
  }

 private:
  absl::StatusOr<std::vector<DeviceBufferRef>> Run(const ShardLaunch& launch) const {
    if (launch.inputs.size() != inputs_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("function '", name_, "' takes ",
                                                     inputs_.size(), " inputs, got ",
                                                     launch.inputs.size()));
    }
    // Every value's buffer; `owned` holds those made here (inputs staged from another backend,
    // op outputs), while the launch holds its inputs.
    absl::InlinedVector<const HostDeviceBuffer*, 8> values;
    absl::InlinedVector<DeviceBufferRef, 8> owned;
    absl::InlinedVector<int, 8> owned_at;  // By value: its index in `owned`, or -1 (an input).
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const DeviceBuffer& in = *launch.inputs[i];
      const ArraySpec& got = in.spec();
      if (got.dtype != inputs_[i].dtype || got.num_elements() != inputs_[i].num_elements()) {
        return absl::InvalidArgumentError(absl::StrCat("function '", name_, "' input ", i,
                                                       " expects ", inputs_[i].ToString(),
                                                       ", got ", got.ToString()));
      }
      if (const HostDeviceBuffer* host = in.AsHost(); host != nullptr) {
        values.push_back(host);
        owned_at.push_back(-1);
        continue;
      }
      // Another backend's buffer (e.g. a PJRT output): read it into host memory.
      auto host = HostDeviceBuffer::Create(got, launch.device);
      absl::Status s = in.CopyToHost(host->mutable_data()).status();
      if (!s.ok()) return Annotate(s, absl::StrCat("function '", name_, "' input ", i));
      values.push_back(host.get());
      owned_at.push_back(static_cast<int>(owned.size()));
      owned.push_back(std::move(host));
    }
    absl::InlinedVector<const HostDeviceBuffer*, 4> operands;
    for (size_t k = 0; k < ops_.size(); ++k) {
      const CompiledOp& op = ops_[k];
      operands.clear();
      for (int v : op.operands) operands.push_back(values[v]);
      auto out = HostDeviceBuffer::Create(op.out, launch.device);
      native::KernelContext ctx{operands, out.get(), op.attrs, launch, static_cast<int>(k)};
      absl::Status s = op.kernel->run(ctx);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("function '", name_, "' op ", k, " (",
                                                   op.kernel->name, ") on ",
                                                   launch.device.ToString(), ": ", s.message()));
      }
      values.push_back(out.get());
      owned_at.push_back(static_cast<int>(owned.size()));
      owned.push_back(std::move(out));
    }
    std::vector<DeviceBufferRef> result;
    result.reserve(outputs_.size());
    // Buffers are immutable once produced, so an output may share a value's buffer.
    for (size_t j = 0; j < outputs_.size(); ++j) {
      const int v = outputs_[j];
      if (owned_at[v] < 0) result.push_back(launch.inputs[v]);
      else if (last_use_[j]) result.push_back(std::move(owned[owned_at[v]]));
      else result.push_back(owned[owned_at[v]]);
    }
    return result;
  }

  const std::string name_;
  const int num_shards_;
  const std::vector<ArraySpec> inputs_;
  const std::vector<CompiledOp> ops_;
  const std::vector<int> outputs_;
  std::vector<bool> last_use_;  // By output: no later output is the same value.
  const std::vector<ArraySpec> output_specs_;
  const int64_t temp_bytes_;
};

}  // namespace

absl::StatusOr<ExecutableRef> CompileNative(const NativeFunctionDef& def, int num_shards) {
  const std::string where = absl::StrCat("function '", def.name, "'");
  if (def.name.empty()) return absl::InvalidArgumentError("function has no name");
  if (num_shards <= 0)
    return absl::InvalidArgumentError(absl::StrCat(where, ": num_shards must be positive"));
  std::vector<ArraySpec> specs;
  for (size_t i = 0; i < def.inputs.size(); ++i) {
    absl::Status s = def.inputs[i].Validate();
    if (!s.ok()) return Annotate(s, absl::StrCat(where, " input ", i));
    specs.push_back(def.inputs[i]);
  }
  std::vector<CompiledOp> ops;
  for (size_t k = 0; k < def.ops.size(); ++k) {
    const NativeOpDef& op = def.ops[k];
    const std::string owhere = absl::StrCat(where, " op ", k, " (", op.kernel, ")");
    const native::KernelDef* kernel = native::FindKernel(op.kernel);
    if (kernel == nullptr) {
      return absl::NotFoundError(absl::StrCat(owhere, ": no native kernel named '", op.kernel,
                                              "'; known: ",
                                              absl::StrJoin(native::KernelNames(), ", ")));
    }
    if (static_cast<int>(op.operands.size()) != kernel->num_operands) {
      return absl::InvalidArgumentError(absl::StrCat(owhere, ": takes ", kernel->num_operands,
                                                     " operands, got ", op.operands.size()));
    }
    for (const auto& a : kernel->required_attrs) {
      if (!op.attrs.contains(a))
        return absl::InvalidArgumentError(absl::StrCat(owhere, ": missing attribute '", a, "'"));
    }
    std::vector<ArraySpec> in;
    for (int v : op.operands) {
      if (v < 0 || v >= static_cast<int>(specs.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            owhere, ": operand ", v, " is not an earlier value (", specs.size(), " defined)"));
      }
      in.push_back(specs[v]);
    }
    auto out = kernel->infer(in, op.attrs, num_shards);
    if (!out.ok()) return Annotate(out.status(), owhere);
    PW_RETURN_IF_ERROR(Annotate(out->Validate(), owhere));
    specs.push_back(*out);
    ops.push_back({kernel, op.operands, op.attrs, *out});
  }
  if (def.outputs.empty())
    return absl::InvalidArgumentError(absl::StrCat(where, " has no outputs"));
  std::vector<ArraySpec> out_specs;
  for (int v : def.outputs) {
    if (v < 0 || v >= static_cast<int>(specs.size()))
      return absl::InvalidArgumentError(absl::StrCat(where, ": output refers to value ", v,
                                                     ", but only ", specs.size(), " exist"));
    out_specs.push_back(specs[v]);
  }
  // Each value is at most 2^48 elements of 8 bytes (Validate), so the sum overflows only past
  // 2^12 ops of that size: refused too, as no device has that memory.
  int64_t temp_bytes = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    const int v = static_cast<int>(def.inputs.size() + k);
    if (std::find(def.outputs.begin(), def.outputs.end(), v) != def.outputs.end()) continue;
    if (__builtin_add_overflow(temp_bytes, ops[k].out.size_bytes(), &temp_bytes))
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": its intermediate values need more than 2^63 bytes"));
  }
  return ExecutableRef(std::make_shared<NativeExecutable>(def.name, num_shards, def.inputs,
                                                          std::move(ops), def.outputs,
                                                          std::move(out_specs), temp_bytes));
}

std::vector<std::string> NativeKernelNames() { return native::KernelNames(); }

}  // namespace pw
