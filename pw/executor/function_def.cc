#include "pw/executor/function_def.h"

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"

namespace pw {

const std::string& FunctionName(const FunctionDef& def) {
  return std::visit([](const auto& d) -> const std::string& { return d.name; }, def);
}

namespace {
int64_t SpecBytes(const std::vector<ArraySpec>& specs) {
  int64_t n = 0;
  for (const ArraySpec& s : specs) n += 8 + 8 * s.shape.rank();
  return n;
}
}  // namespace

int64_t DefinitionBytes(const FunctionDef& def) {
  if (const auto* native = std::get_if<NativeFunctionDef>(&def)) {
    int64_t n = native->name.size() + SpecBytes(native->inputs) +
                sizeof(int) * native->outputs.size();
    for (const NativeOpDef& op : native->ops) {
      n += op.kernel.size() + sizeof(int) * op.operands.size();
      for (const auto& [key, value] : op.attrs) n += key.size() + sizeof(value);
    }
    return n;
  }
  const auto& hlo = std::get<StableHloFunctionDef>(def);
  return hlo.name.size() + hlo.module.size() + SpecBytes(hlo.inputs) + SpecBytes(hlo.outputs);
}

absl::StatusOr<FunctionSignature> SignatureOf(const FunctionDef& def, int num_shards) {
  if (const auto* native = std::get_if<NativeFunctionDef>(&def)) {
    PW_ASSIGN_OR_RETURN(ExecutableRef exe, CompileNative(*native, num_shards));
    return FunctionSignature{exe->name(), exe->input_specs(), exe->output_specs(),
                             exe->temp_bytes()};
  }
  const auto& hlo = std::get<StableHloFunctionDef>(def);
  const std::string where = absl::StrCat("function '", hlo.name, "'");
  if (hlo.name.empty()) return absl::InvalidArgumentError("function has no name");
  if (hlo.module.empty())
    return absl::InvalidArgumentError(absl::StrCat(where, " has an empty StableHLO module"));
  if (hlo.outputs.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " has no outputs"));
  if (hlo.num_partitions < 1)
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", hlo.num_partitions, " partitions; needs at least 1"));
  if (hlo.collective_axis_size < 0 ||
      (hlo.collective_axis_size > 0 && hlo.num_partitions != 1))
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has collective axis size ", hlo.collective_axis_size, " and ",
        hlo.num_partitions, " partitions; runtime collectives need a per-shard module"));
  if (hlo.collective_axis_size > 0 && hlo.collective_axis_size != num_shards)
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has collectives over an axis of ", hlo.collective_axis_size,
        " devices and cannot run on a slice of ", num_shards, " devices"));
  if (hlo.num_partitions > 1 && hlo.num_partitions != num_shards)
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is an SPMD module of ", hlo.num_partitions,
        " partitions and cannot run on a slice of ", num_shards, " devices"));
  for (size_t i = 0; i < hlo.inputs.size(); ++i)
    PW_RETURN_IF_ERROR(Annotate(hlo.inputs[i].Validate(), absl::StrCat(where, " input ", i)));
  for (size_t i = 0; i < hlo.outputs.size(); ++i)
    PW_RETURN_IF_ERROR(Annotate(hlo.outputs[i].Validate(), absl::StrCat(where, " output ", i)));
  return FunctionSignature{hlo.name, hlo.inputs, hlo.outputs};
}

}  // namespace pw
