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

// Writes `size` bytes to `path` through a temporary file of its own in the same directory
// (created exclusively), synced, then renamed over `path` (or, without `replace`, only if
// nothing is there: AlreadyExists). A reader never sees part of the file.
absl::Status WriteFileDurably(const std::string& path, const void* data, size_t size,
                              bool replace = true);
// Syncs a directory's entries (after files were renamed into it).
absl::Status SyncDirectory(const std::string& dir);

// Reads `dir`/.zarray.
absl::StatusOr<ZarrArray> ReadZarray(const std::string& dir);
// Writes `dir`/.zarray (the directory exists).
absl::Status WriteZarray(const std::string& dir, const ZarrArray& z);

// Writes the chunk of `z` in `dir` whose region is `box` (a chunk's corner; its extent the chunk
// shape, or less at the array's edge: then padded with zeros) from `data`, dense over `box`.
// Written durably (WriteFileDurably): a reader never sees part of a chunk.
absl::Status WriteChunk(const std::string& dir, const ZarrArray& z, const Box& box,
                        const void* data);

// Reads region `box` of the array in `dir` (described by `z`) into `dst`, dense over `box`, from
// every chunk it overlaps. A missing chunk reads as zeros (the fill value: Orbax may leave out
// chunks equal to it); a short, long or damaged one, or one that is not a regular file, is an
// error naming its file.
absl::Status ReadRegion(const std::string& dir, const ZarrArray& z, const Box& box, void* dst);

}  // namespace pw::checkpoint
