#include "pw/base/sharding.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {

int64_t Box::num_elements() const {
  int64_t n = 1;
  for (size_t i = 0; i < start.size(); ++i) n *= std::max<int64_t>(0, limit[i] - start[i]);
  return n;
}

Sharding Sharding::Replicated(std::vector<int64_t> mesh_shape, int rank) {
  return Sharding(std::move(mesh_shape), std::vector<int>(rank, -1));
}

Sharding Sharding::Split(std::vector<int64_t> mesh_shape, int rank, int dim, int axis) {
  std::vector<int> d2a(rank, -1);
  if (dim >= 0 && dim < rank) d2a[dim] = axis;
  return Sharding(std::move(mesh_shape), std::move(d2a));
}

int Sharding::num_devices() const {
  int64_t n = 1;
  for (int64_t m : mesh_shape_) n *= m;
  return static_cast<int>(n);
}

bool Sharding::IsReplicated() const {
  return std::all_of(dim_to_axis_.begin(), dim_to_axis_.end(), [](int a) { return a < 0; });
}

absl::Status Sharding::Validate(const Shape& global) const {
  if (mesh_shape_.empty()) return absl::InvalidArgumentError("sharding has an empty mesh");
  int64_t devices = 1;
  for (int64_t m : mesh_shape_) {
    if (m <= 0) return absl::InvalidArgumentError(absl::StrCat("sharding ", ToString(), " has a non-positive mesh axis"));
    if (__builtin_mul_overflow(devices, m, &devices) || devices > (int64_t{1} << 30))
      return absl::InvalidArgumentError(absl::StrCat("sharding ", ToString(), " has too many devices"));
  }
  if (static_cast<int>(dim_to_axis_.size()) != global.rank()) {
    return absl::InvalidArgumentError(absl::StrCat("sharding ", ToString(), " has rank ",
                                                   dim_to_axis_.size(), " but the array ",
                                                   global.ToString(), " has rank ", global.rank()));
  }
  std::vector<bool> used(mesh_shape_.size(), false);
  for (int d = 0; d < global.rank(); ++d) {
    int a = dim_to_axis_[d];
    if (a < 0) continue;
    if (a >= static_cast<int>(mesh_shape_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding ", ToString(), ": dimension ", d, " uses mesh axis ", a,
                       " but the mesh has ", mesh_shape_.size(), " axes"));
    }
    if (used[a]) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding ", ToString(), ": mesh axis ", a, " splits two dimensions"));
    }
    used[a] = true;
    if (global.dim(d) % mesh_shape_[a] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sharding ", ToString(), ": dimension ", d, " of ", global.ToString(),
          " is not divisible by mesh axis ", a, " of size ", mesh_shape_[a]));
    }
  }
  return absl::OkStatus();
}

Shape Sharding::ShardShape(const Shape& global) const {
  std::vector<int64_t> dims(global.dims().begin(), global.dims().end());
  for (size_t d = 0; d < dims.size() && d < dim_to_axis_.size(); ++d) {
    if (dim_to_axis_[d] >= 0) dims[d] /= mesh_shape_[dim_to_axis_[d]];
  }
  return Shape(std::move(dims));
}

Box Sharding::ShardBox(const Shape& global, int device_index) const {
  // Mesh coordinates of the device, row-major.
  std::vector<int64_t> coord(mesh_shape_.size());
  int64_t rest = device_index;
  for (int a = static_cast<int>(mesh_shape_.size()) - 1; a >= 0; --a) {
    coord[a] = rest % mesh_shape_[a];
    rest /= mesh_shape_[a];
  }
  Box box;
  for (int d = 0; d < global.rank(); ++d) {
    int a = dim_to_axis_[d];
    if (a < 0) {
      box.start.push_back(0);
      box.limit.push_back(global.dim(d));
    } else {
      int64_t chunk = global.dim(d) / mesh_shape_[a];
      box.start.push_back(coord[a] * chunk);
      box.limit.push_back((coord[a] + 1) * chunk);
    }
  }
  return box;
}

std::string Sharding::ToString() const {
  return absl::StrCat("{mesh=[", absl::StrJoin(mesh_shape_, ","), "] dims->axes=[",
                      absl::StrJoin(dim_to_axis_, ","), "]}");
}

namespace {
// Copies the intersection `ib` row by row: an odometer over its outer dimensions (no recursion,
// so any rank is safe), one memcpy per innermost row.
void CopyRows(const char* src, const Box& sb, char* dst, const Box& db, const Box& ib, size_t esz,
              const std::vector<int64_t>& sstride, const std::vector<int64_t>& dstride) {
  const int rank = static_cast<int>(ib.start.size());
  const int inner = rank - 1;
  const size_t row_bytes = static_cast<size_t>(ib.limit[inner] - ib.start[inner]) * esz;
  std::vector<int64_t> index(ib.start.begin(), ib.start.end());
  while (true) {
    int64_t so = 0, dof = 0;
    for (int d = 0; d < rank; ++d) {
      so += (index[d] - sb.start[d]) * sstride[d];
      dof += (index[d] - db.start[d]) * dstride[d];
    }
    std::memcpy(dst + dof * esz, src + so * esz, row_bytes);
    int d = inner - 1;
    for (; d >= 0; --d) {  // Next row: advance the odometer.
      if (++index[d] < ib.limit[d]) break;
      index[d] = ib.start[d];
    }
    if (d < 0) return;
  }
}
std::vector<int64_t> Strides(const Box& b) {
  std::vector<int64_t> s(b.start.size(), 1);
  for (int d = static_cast<int>(b.start.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * (b.limit[d + 1] - b.start[d + 1]);
  return s;
}
}  // namespace

int64_t CopyBoxIntersection(const void* src, const Box& src_box, void* dst, const Box& dst_box,
                            size_t element_size) {
  const size_t rank = src_box.start.size();
  if (rank == 0) {  // Scalars: one element.
    std::memcpy(dst, src, element_size);
    return 1;
  }
  Box ib;
  for (size_t d = 0; d < rank; ++d) {
    ib.start.push_back(std::max(src_box.start[d], dst_box.start[d]));
    ib.limit.push_back(std::min(src_box.limit[d], dst_box.limit[d]));
    if (ib.limit[d] <= ib.start[d]) return 0;
  }
  CopyRows(static_cast<const char*>(src), src_box, static_cast<char*>(dst), dst_box, ib,
           element_size, Strides(src_box), Strides(dst_box));
  return ib.num_elements();
}

}  // namespace pw
