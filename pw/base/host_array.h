// HostArray: a dense, row-major array in host memory (what clients put and fetch).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pw/base/shape.h"

namespace pw {

// An allocator whose elements start uninitialized: `resize(n)` and `Bytes(n)` do not write the
// new bytes, so a buffer that a read or copy is about to fill costs no extra pass over memory (a
// zero-filled 1 GiB destination is a second write of every byte). Bytes(n, 0) zeroes.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using Bytes = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

struct HostArray {
  ArraySpec spec;
  Bytes bytes;  // spec.size_bytes() bytes.

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
