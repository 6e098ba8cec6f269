#include "pw/base/shape.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {

int64_t Shape::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

absl::Status Shape::Validate() const {
  if (rank() > kMaxRank) {  // Named by rank: the shape itself may be megabytes of text.
    return absl::InvalidArgumentError(absl::StrCat(
        "shape of rank ", rank(), " exceeds the limit of ", kMaxRank, " dimensions"));
  }
  int64_t n = 1;
  for (int i = 0; i < rank(); ++i) {
    if (dims_[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ToString(), " has negative dimension ", i));
    }
    if (dims_[i] > kMaxElements) {  // Even after a 0 dimension: sizes are computed from dims.
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ToString(), " has dimension ", i, " above 2^48"));
    }
    if (__builtin_mul_overflow(n, dims_[i], &n) || n > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ToString(), " has more than 2^48 elements"));
    }
  }
  return absl::OkStatus();
}

std::string Shape::ToString() const { return absl::StrCat("[", absl::StrJoin(dims_, ","), "]"); }

absl::Status ArraySpec::Validate() const {
  if (dtype == DType::kInvalid) return absl::InvalidArgumentError("array spec has no dtype");
  return shape.Validate();  // 2^48 elements of at most 8 bytes fit in int64.
}

std::string ArraySpec::ToString() const { return absl::StrCat(DTypeName(dtype), shape.ToString()); }

}  // namespace pw
