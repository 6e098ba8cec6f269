// Shardings of a global array over a slice's device mesh. Pure bottom layer.
//
// A slice's devices form a mesh (row-major over the slice's device list). A Sharding says, for
// each array dimension, which mesh axis it is split along (or none). Mesh axes that split no
// dimension replicate the array along them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "pw/base/shape.h"

namespace pw {

// A half-open index box [start, limit) in global coordinates.
struct Box {
  std::vector<int64_t> start;
  std::vector<int64_t> limit;
  int64_t num_elements() const;
  friend bool operator==(const Box&, const Box&) = default;
};

class Sharding {
 public:
  Sharding() = default;
  // dim_to_axis[d] is the mesh axis splitting array dimension d, or -1.
  Sharding(std::vector<int64_t> mesh_shape, std::vector<int> dim_to_axis)
      : mesh_shape_(std::move(mesh_shape)), dim_to_axis_(std::move(dim_to_axis)) {}

  static Sharding Replicated(std::vector<int64_t> mesh_shape, int rank);
  // Splits dimension `dim` along mesh axis `axis`; other dimensions are whole.
  static Sharding Split(std::vector<int64_t> mesh_shape, int rank, int dim, int axis = 0);

  absl::Span<const int64_t> mesh_shape() const { return mesh_shape_; }
  absl::Span<const int> dim_to_axis() const { return dim_to_axis_; }
  int num_devices() const;
  bool IsReplicated() const;

  // Checks the sharding fits `global`: ranks agree, axes are in range and used at most once,
  // and every split dimension divides evenly.
  absl::Status Validate(const Shape& global) const;
  // Shape of every shard (all shards have the same shape).
  Shape ShardShape(const Shape& global) const;
  // The region of the global array held by the device at `device_index` of the slice.
  Box ShardBox(const Shape& global, int device_index) const;
  std::string ToString() const;
  friend bool operator==(const Sharding&, const Sharding&) = default;

 private:
  std::vector<int64_t> mesh_shape_;
  std::vector<int> dim_to_axis_;
};

// Copies the intersection of `src_box` and `dst_box` from `src` (a dense row-major array holding
// exactly src_box) into `dst` (dense, holding exactly dst_box). Returns the elements copied.
int64_t CopyBoxIntersection(const void* src, const Box& src_box, void* dst, const Box& dst_box,
                            size_t element_size);

}  // namespace pw
