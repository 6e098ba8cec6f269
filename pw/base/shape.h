// Static array shapes and (shape, dtype) specs. Pure bottom layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "pw/base/dtype.h"

namespace pw {

// A static, row-major shape. Rank 0 is a scalar.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_[i]; }
  absl::Span<const int64_t> dims() const { return dims_; }
  int64_t num_elements() const;
  // Checks the rank is at most kMaxRank, every dimension is in [0, kMaxElements] and the
  // element count is at most kMaxElements.
  absl::Status Validate() const;
  static constexpr int64_t kMaxElements = int64_t{1} << 48;
  static constexpr int kMaxRank = 64;  // XLA's own limit is lower in practice.
  std::string ToString() const;  // "[2,3]", "[]" for a scalar.
  friend bool operator==(const Shape&, const Shape&) = default;

 private:
  std::vector<int64_t> dims_;
};

// Shape + element type of an array (or of one shard).
struct ArraySpec {
  DType dtype = DType::kInvalid;
  Shape shape;

  int64_t num_elements() const { return shape.num_elements(); }
  int64_t size_bytes() const { return num_elements() * static_cast<int64_t>(DTypeSize(dtype)); }
  // Checks the dtype and shape, and that the size in bytes fits in int64.
  absl::Status Validate() const;
  std::string ToString() const;  // "f32[2,3]"
  friend bool operator==(const ArraySpec&, const ArraySpec&) = default;
};

}  // namespace pw
