#include "pw/base/host_array.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pw {
namespace {
std::string Elem(const HostArray& a, int64_t i) {
  const uint8_t* p = a.bytes.data();
  switch (a.spec.dtype) {
    case DType::kF32:
    case DType::kF64: {
      double v = a.spec.dtype == DType::kF32 ? reinterpret_cast<const float*>(p)[i]
                                             : reinterpret_cast<const double*>(p)[i];
      if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e16)
        return absl::StrFormat("%.0f.", v);  // numpy prints 3.0 as "3."
      return absl::StrFormat("%g", v);
    }
    case DType::kS32: return absl::StrCat(reinterpret_cast<const int32_t*>(p)[i]);
    case DType::kS64: return absl::StrCat(reinterpret_cast<const int64_t*>(p)[i]);
    case DType::kU8:
    case DType::kPred: return absl::StrCat(p[i]);
    default: return "?";
  }
}
std::string Render(const HostArray& a, int dim, int64_t& pos) {
  if (dim == a.spec.shape.rank()) return Elem(a, pos++);
  std::string s = "[";
  for (int64_t i = 0; i < a.spec.shape.dim(dim); ++i) {
    if (i) s += ", ";
    s += Render(a, dim + 1, pos);
  }
  return s + "]";
}
}  // namespace

std::string HostArray::ToString() const {
  int64_t pos = 0;
  return absl::StrCat("array(", Render(*this, 0, pos), ")");
}

}  // namespace pw
