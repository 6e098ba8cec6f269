// Zarr v2 arrays on a local (or shared) filesystem, as Orbax writes them without OCDBT: a
// directory per array holding `.zarray` (JSON: shape, chunk shape, dtype, compressor) and one file
// per chunk, named by its chunk index joined with "." ("0" for a scalar), each chunk dense in C
// order and whole (an edge chunk padded to the chunk shape), raw or zstd-compressed.
//
// Pathways writes one chunk per shard (every shard of a sharding has one shape), uncompressed;
// it reads raw and zstd chunks, any chunk shape, so a region of any sharding can be read from an
// array another sharding (or stock Orbax) wrote. Pure: files and bytes only; thread-compatible.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pw/base/shape.h"
#include "pw/base/sharding.h"

namespace pw::checkpoint {

// Limits, checked where metadata is read: a `.zarray` larger than this is refused, and so is a
// chunk (decompressed) larger than kMaxChunkBytes or, in any dimension, than the array.
inline constexpr size_t kMaxZarrayBytes = 64 << 10;
inline constexpr int64_t kMaxChunkBytes = int64_t{4} << 30;

struct ZarrArray {
  ArraySpec spec;  // Element type and the global shape.
  Shape chunks;    // Same rank as spec.shape; every extent positive.
  bool zstd = false;

  // `.zarray` as Pathways writes it (compressor null).
  std::string ToJson() const;
  // A `.zarray`'s contents; errors name `where`.
  static absl::StatusOr<ZarrArray> Parse(absl::string_view json, absl::string_view where);
  // The chunk file holding the chunk at `start` (a corner of the chunk grid), e.g. "1.0".
  std::string ChunkKey(absl::Span<const int64_t> start) const;
  int64_t chunk_bytes() const;
};

// Zarr v2's name of a dtype ("<f4", "bfloat16", "|b1", ...), and back.
absl::StatusOr<std::string> ZarrDtype(DType dtype);
absl::StatusOr<DType> DTypeOfZarr(absl::string_view name);

// Reads `dir`/.zarray.
absl::StatusOr<ZarrArray> ReadZarray(const std::string& dir);
// Writes `dir`/.zarray (the directory exists).
absl::Status WriteZarray(const std::string& dir, const ZarrArray& z);

// Writes the chunk of `z` in `dir` whose region is `box` (a chunk's corner; its extent the chunk
// shape, or less at the array's edge: then padded with zeros) from `data`, dense over `box`.
// Written to a temporary name and renamed, so a reader never sees part of a chunk.
absl::Status WriteChunk(const std::string& dir, const ZarrArray& z, const Box& box,
                        const void* data);

// Reads region `box` of the array in `dir` (described by `z`) into `dst`, dense over `box`, from
// every chunk it overlaps. A missing or short chunk is an error naming its file.
absl::Status ReadRegion(const std::string& dir, const ZarrArray& z, const Box& box, void* dst);

}  // namespace pw::checkpoint
