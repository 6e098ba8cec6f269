// HostArray: a dense, row-major array in host memory (what clients put and fetch).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/base/shape.h"

namespace pw {

struct HostArray {
  ArraySpec spec;
  std::vector<uint8_t> bytes;  // spec.size_bytes() bytes.

  // Copies `values` (whose element type must match `dtype`'s size) into a new array.
  template <typename T>
  static absl::StatusOr<HostArray> Of(DType dtype, Shape shape, const std::vector<T>& values) {
    HostArray a{{dtype, std::move(shape)}, {}};
    if (sizeof(T) != DTypeSize(dtype) ||
        static_cast<int64_t>(values.size()) != a.spec.num_elements()) {
      return absl::InvalidArgumentError("host array: values do not match " + a.spec.ToString());
    }
    a.bytes.resize(a.spec.size_bytes());
    std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
    return a;
  }
  template <typename T>
  std::vector<T> values() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
  }
  // Numpy-style rendering, e.g. "array([3., 5.])" for f32[2].
  std::string ToString() const;
};

}  // namespace pw
