#include "absl/strings/string_view.h"
#include "pw/base/dtype.h"

#include "absl/strings/str_cat.h"

namespace pw {
namespace {
struct Info {
  DType type;
  absl::string_view name;
  size_t size;
};
constexpr Info kInfos[] = {
    {DType::kInvalid, "invalid", 0}, {DType::kPred, "pred", 1}, {DType::kS8, "s8", 1},
    {DType::kS32, "s32", 4},         {DType::kS64, "s64", 8},   {DType::kU8, "u8", 1},
    {DType::kU32, "u32", 4},         {DType::kF16, "f16", 2},   {DType::kBF16, "bf16", 2},
    {DType::kF32, "f32", 4},         {DType::kF64, "f64", 8},
};
const Info& InfoOf(DType t) {
  for (const auto& i : kInfos)
    if (i.type == t) return i;
  return kInfos[0];
}
}  // namespace

size_t DTypeSize(DType t) { return InfoOf(t).size; }
absl::string_view DTypeName(DType t) { return InfoOf(t).name; }
bool IsFloating(DType t) {
  return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32 || t == DType::kF64;
}
absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (const auto& i : kInfos)
    if (i.name == name && i.type != DType::kInvalid) return i.type;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

}  // namespace pw
