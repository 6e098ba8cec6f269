// Element types. Pure bottom layer.
#pragma once

#include "absl/strings/string_view.h"
#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pw {

// Values are on the wire (ArraySpecProto.dtype): new types go at the end.
enum class DType {
  kInvalid = 0, kPred, kS8, kS32, kS64, kU8, kU32, kF16, kBF16, kF32, kF64,
  kS16, kU16, kU64, kC64,
  kLast = kC64,
};

// Size of one element in bytes; 0 for kInvalid. Inline: it is on every kernel's path.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kPred:
    case DType::kS8:
    case DType::kU8: return 1;
    case DType::kS16:
    case DType::kU16:
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kS32:
    case DType::kU32:
    case DType::kF32: return 4;
    case DType::kS64:
    case DType::kU64:
    case DType::kF64:
    case DType::kC64: return 8;
    case DType::kInvalid: return 0;
  }
  return 0;
}
// Lower-case name as in XLA ("f32", "s32", "pred", ...).
absl::string_view DTypeName(DType t);
absl::StatusOr<DType> DTypeFromName(absl::string_view name);
bool IsFloating(DType t);

}  // namespace pw
