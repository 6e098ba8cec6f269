#include "absl/strings/string_view.h"
#include "pw/base/dtype.h"

#include "absl/strings/str_cat.h"

namespace pw {
namespace {
struct Info {
  DType type;
  absl::string_view name;
};
constexpr Info kInfos[] = {
    {DType::kInvalid, "invalid"}, {DType::kPred, "pred"}, {DType::kS8, "s8"},
    {DType::kS32, "s32"},         {DType::kS64, "s64"},   {DType::kU8, "u8"},
    {DType::kU32, "u32"},         {DType::kF16, "f16"},   {DType::kBF16, "bf16"},
    {DType::kF32, "f32"},         {DType::kF64, "f64"},   {DType::kS16, "s16"},
    {DType::kU16, "u16"},         {DType::kU64, "u64"},   {DType::kC64, "c64"},
};
const Info& InfoOf(DType t) {
  for (const auto& i : kInfos)
    if (i.type == t) return i;
  return kInfos[0];
}
}  // namespace

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
