#include "pw/checkpoint/zarr.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "pw/base/status_macros.h"

namespace pw::checkpoint {
namespace {

struct DtypeName {
  DType dtype;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {DType::kPred, "|b1"}, {DType::kS8, "|i1"},  {DType::kU8, "|u1"},   {DType::kS16, "<i2"},
    {DType::kU16, "<u2"},  {DType::kS32, "<i4"}, {DType::kU32, "<u4"},  {DType::kS64, "<i8"},
    {DType::kU64, "<u8"},  {DType::kF16, "<f2"}, {DType::kBF16, "bfloat16"},
    {DType::kF32, "<f4"},  {DType::kF64, "<f8"}, {DType::kC64, "<c8"},
};

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

// Opens `path` for reading if it is a regular file (not a link, a FIFO that would block, a
// device).
absl::StatusOr<int> OpenRegular(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Errno("cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::DataLossError(absl::StrCat(path, " is not a regular file"));
  }
  return fd;
}

// The whole file at `path`, refused past `max` bytes.
absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max) {
  PW_ASSIGN_OR_RETURN(const int fd, OpenRegular(path));
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = Errno("cannot read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    if (static_cast<int64_t>(out.size()) + n > max) {
      close(fd);
      return absl::DataLossError(absl::StrCat(path, " is larger than ", max, " bytes"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// Reads exactly `size` bytes of `path` into `dst` (a file of another size is DataLoss).
absl::Status ReadExactly(const std::string& path, void* dst, int64_t size) {
  PW_ASSIGN_OR_RETURN(const int fd, OpenRegular(path));
  char* p = static_cast<char*>(dst);
  int64_t got = 0;
  absl::Status s;
  while (s.ok()) {
    // One byte past `size`, to see a longer file.
    char extra;
    const ssize_t n = got < size ? read(fd, p + got, static_cast<size_t>(size - got))
                                 : read(fd, &extra, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) s = Errno("cannot read", path);
    if (n <= 0) break;
    got += n;
    if (got > size)
      s = absl::DataLossError(absl::StrCat(path, " holds more than ", size, " bytes"));
  }
  close(fd);
  if (s.ok() && got != size)
    s = absl::DataLossError(absl::StrCat(path, " holds ", got, " bytes, not ", size));
  return s;
}

}  // namespace

absl::Status WriteFileDurably(const std::string& path, const void* data, size_t size,
                              bool replace) {
  static std::atomic<uint64_t> next{0};
  const std::string tmp = absl::StrCat(path, ".tmp-", getpid(), "-", next++);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Status s;
  const char* p = static_cast<const char*>(data);
  for (size_t left = size; left > 0 && s.ok();) {
    const ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      s = n < 0 ? Errno("cannot write", tmp) : absl::InternalError(absl::StrCat("cannot write ", tmp));
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (s.ok() && fsync(fd) != 0) s = Errno("cannot sync", tmp);
  if (close(fd) != 0 && s.ok()) s = Errno("cannot write", tmp);
  if (s.ok()) {
    const int r = replace ? rename(tmp.c_str(), path.c_str())
                          : renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(),
                                      RENAME_NOREPLACE);
    if (r != 0)
      s = errno == EEXIST ? absl::AlreadyExistsError(absl::StrCat(path, " exists"))
                          : Errno("cannot rename to", path);
  }
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", dir);
  absl::Status s = fsync(fd) == 0 ? absl::OkStatus() : Errno("cannot sync", dir);
  close(fd);
  return s;
}

absl::StatusOr<std::string> ZarrDtype(DType dtype) {
  for (const DtypeName& d : kDtypes)
    if (d.dtype == dtype) return std::string(d.name);
  return absl::InvalidArgumentError(absl::StrCat("no zarr dtype for ", DTypeName(dtype)));
}

absl::StatusOr<DType> DTypeOfZarr(absl::string_view name) {
  for (const DtypeName& d : kDtypes) {
    absl::string_view n = d.name;
    if (name == n) return d.dtype;
    // One-byte types with any byte order ("<u1", "u1"); a little-endian type without its "<".
    if (n[0] == '|' && (name == absl::StrCat("<", n.substr(1)) || name == n.substr(1)))
      return d.dtype;
    if (n[0] == '<' && name == n.substr(1)) return d.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "zarr dtype \"", name, "\" is not supported (little-endian numbers, bool, bfloat16)"));
}

int64_t ZarrArray::chunk_bytes() const {
  return chunks.num_elements() * static_cast<int64_t>(DTypeSize(spec.dtype));
}

std::string ZarrArray::ChunkKey(absl::Span<const int64_t> start) const {
  if (start.empty()) return "0";
  std::vector<int64_t> index(start.size());
  for (size_t d = 0; d < start.size(); ++d) index[d] = start[d] / chunks.dim(static_cast<int>(d));
  return absl::StrJoin(index, ".");
}

std::string ZarrArray::ToJson() const {
  nlohmann::json j;
  j["chunks"] = std::vector<int64_t>(chunks.dims().begin(), chunks.dims().end());
  j["compressor"] = nullptr;
  j["dimension_separator"] = ".";
  j["dtype"] = *ZarrDtype(spec.dtype);
  j["fill_value"] = nullptr;
  j["filters"] = nullptr;
  j["order"] = "C";
  j["shape"] = std::vector<int64_t>(spec.shape.dims().begin(), spec.shape.dims().end());
  j["zarr_format"] = 2;
  return j.dump();
}

absl::StatusOr<ZarrArray> ZarrArray::Parse(absl::string_view json, absl::string_view where) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(where, ": ", why));
  };
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return bad("not a JSON object");
  // Every field is read after its type is checked: a file of any content is an error, never an
  // exception.
  auto string_or = [&](const char* key, const char* absent) -> std::optional<std::string> {
    auto it = j.find(key);
    if (it == j.end()) return absent;
    if (!it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  auto format = j.find("zarr_format");
  if (format == j.end() || !format->is_number_integer() || format->get<int64_t>() != 2)
    return bad("not zarr_format 2");
  auto dims = [&](const char* key) -> absl::StatusOr<Shape> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return bad(absl::StrCat("no \"", key, "\" list"));
    std::vector<int64_t> v;
    for (const auto& x : *it) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0)
        return bad(absl::StrCat("\"", key, "\" holds a non-integer or a negative"));
      v.push_back(x.get<int64_t>());
    }
    return Shape(std::move(v));
  };
  ZarrArray z;
  PW_ASSIGN_OR_RETURN(z.spec.shape, dims("shape"));
  PW_ASSIGN_OR_RETURN(z.chunks, dims("chunks"));
  if (z.chunks.rank() != z.spec.shape.rank()) return bad("chunks and shape differ in rank");
  for (int d = 0; d < z.chunks.rank(); ++d) {
    if (z.chunks.dim(d) <= 0) return bad("a chunk extent is not positive");
    // Larger than the array is never needed, and would make a reader allocate for nothing.
    if (z.chunks.dim(d) > std::max<int64_t>(z.spec.shape.dim(d), 1))
      return bad("a chunk is larger than the array");
  }
  const std::optional<std::string> dtype_name = string_or("dtype", "");
  if (!dtype_name || dtype_name->empty()) return bad("no dtype");
  absl::StatusOr<DType> dtype = DTypeOfZarr(*dtype_name);
  if (!dtype.ok()) return bad(dtype.status().message());
  z.spec.dtype = *dtype;
  if (absl::Status s = z.spec.Validate(); !s.ok()) return bad(s.message());
  if (string_or("order", "C") != "C") return bad("order is not \"C\"");
  if (string_or("dimension_separator", ".") != ".") return bad("dimension_separator is not \".\"");
  if (j.contains("filters") && !j["filters"].is_null()) return bad("filters are not supported");
  // Missing chunks read as zeros (Orbax may leave out chunks equal to the fill value).
  if (j.contains("fill_value") && !j["fill_value"].is_null() &&
      !(j["fill_value"].is_number() && j["fill_value"].get<double>() == 0))
    return bad("a fill_value other than null or 0 is not supported");
  if (j.contains("compressor") && !j["compressor"].is_null()) {
    const auto& c = j["compressor"];
    auto id = c.is_object() ? c.find("id") : c.end();
    if (!c.is_object() || id == c.end() || !id->is_string() || id->get<std::string>() != "zstd")
      return bad("compressor is neither null nor zstd");
    z.zstd = true;
  }
  int64_t elements = 1;
  for (int64_t c : z.chunks.dims())
    if (__builtin_mul_overflow(elements, c, &elements)) elements = kMaxChunkBytes + 1;
  if (elements > kMaxChunkBytes / std::max<int64_t>(1, DTypeSize(z.spec.dtype)))
    return bad(absl::StrCat("a chunk is larger than ", kMaxChunkBytes, " bytes"));
  return z;
}

absl::StatusOr<ZarrArray> ReadZarray(const std::string& dir) {
  const std::string path = dir + "/.zarray";
  PW_ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxZarrayBytes));
  return ZarrArray::Parse(text, path);
}

absl::Status WriteZarray(const std::string& dir, const ZarrArray& z) {
  const std::string text = z.ToJson();
  return WriteFileDurably(dir + "/.zarray", text.data(), text.size());
}

absl::Status WriteChunk(const std::string& dir, const ZarrArray& z, const Box& box,
                        const void* data) {
  const int rank = z.spec.shape.rank();
  if (static_cast<int>(box.start.size()) != rank || static_cast<int>(box.limit.size()) != rank)
    return absl::InvalidArgumentError("chunk region's rank differs from the array's");
  Box chunk{box.start, box.start};
  bool whole = true;
  for (int d = 0; d < rank; ++d) {
    const int64_t c = z.chunks.dim(d);
    if (box.start[d] % c != 0 || box.limit[d] > z.spec.shape.dim(d) ||
        box.limit[d] != std::min(box.start[d] + c, z.spec.shape.dim(d)))
      return absl::InvalidArgumentError(absl::StrCat(
          "region is not a chunk of ", z.spec.ToString(), " in chunks of ", z.chunks.ToString()));
    chunk.limit[d] = box.start[d] + c;
    whole = whole && box.limit[d] == chunk.limit[d];
  }
  const std::string path = absl::StrCat(dir, "/", z.ChunkKey(box.start));
  if (whole) return WriteFileDurably(path, data, static_cast<size_t>(z.chunk_bytes()));
  std::vector<char> padded(static_cast<size_t>(z.chunk_bytes()), 0);
  CopyBoxIntersection(data, box, padded.data(), chunk, DTypeSize(z.spec.dtype));
  return WriteFileDurably(path, padded.data(), padded.size());
}

absl::Status ReadRegion(const std::string& dir, const ZarrArray& z, const Box& box, void* dst) {
  const int rank = z.spec.shape.rank();
  if (static_cast<int>(box.start.size()) != rank || static_cast<int>(box.limit.size()) != rank)
    return absl::InvalidArgumentError("region's rank differs from the array's");
  for (int d = 0; d < rank; ++d)
    if (box.start[d] < 0 || box.start[d] > box.limit[d] || box.limit[d] > z.spec.shape.dim(d))
      return absl::InvalidArgumentError(
          absl::StrCat("region is outside ", z.spec.ToString(), " of ", dir));
  const size_t element = DTypeSize(z.spec.dtype);
  const int64_t bytes = z.chunk_bytes();
  std::unique_ptr<char[]> chunk;  // A chunk's bytes, when the region is not one whole chunk.
  // The chunks overlapping `box`, by their corners, odometer order.
  std::vector<int64_t> first(rank), last(rank);
  for (int d = 0; d < rank; ++d) {
    const int64_t c = z.chunks.dim(d);
    if (box.start[d] == box.limit[d]) return absl::OkStatus();  // Empty.
    first[d] = box.start[d] / c * c;
    last[d] = (box.limit[d] - 1) / c * c;
  }
  std::vector<int64_t> at = first;
  while (true) {
    const std::string path = absl::StrCat(dir, "/", z.ChunkKey(at));
    Box src{at, at};
    for (int d = 0; d < rank; ++d) src.limit[d] = at[d] + z.chunks.dim(d);
    if ((z.zstd || src != box) && chunk == nullptr) chunk.reset(new char[bytes]);
    // A chunk that is not there holds the fill value, zero.
    auto missing = [](const absl::Status& s) { return absl::IsNotFound(s); };
    if (z.zstd) {
      absl::StatusOr<std::string> file = ReadFile(path, kMaxChunkBytes);
      if (!file.ok() && !missing(file.status())) return file.status();
      if (!file.ok()) {
        std::memset(chunk.get(), 0, static_cast<size_t>(bytes));
      } else {
        const size_t n = ZSTD_decompress(chunk.get(), static_cast<size_t>(bytes), file->data(),
                                         file->size());
        if (ZSTD_isError(n))
          return absl::DataLossError(absl::StrCat(path, ": zstd: ", ZSTD_getErrorName(n)));
        if (static_cast<int64_t>(n) != bytes)
          return absl::DataLossError(absl::StrCat(path, " holds ", n, " bytes, not ", bytes));
      }
    } else if (src == box) {  // The region is this chunk (a shard read back as written).
      absl::Status s = ReadExactly(path, dst, bytes);
      if (missing(s)) std::memset(dst, 0, static_cast<size_t>(bytes));
      return missing(s) ? absl::OkStatus() : s;
    } else {
      absl::Status s = ReadExactly(path, chunk.get(), bytes);
      if (!s.ok() && !missing(s)) return s;
      if (!s.ok()) std::memset(chunk.get(), 0, static_cast<size_t>(bytes));
    }
    CopyBoxIntersection(chunk.get(), src, dst, box, element);
    int d = rank - 1;
    for (; d >= 0; --d) {
      if (at[d] < last[d]) {
        at[d] += z.chunks.dim(d);
        break;
      }
      at[d] = first[d];
    }
    if (d < 0) return absl::OkStatus();
  }
}

}  // namespace pw::checkpoint
