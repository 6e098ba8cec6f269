#include "pw/checkpoint/zarr.h"

#include <sys/stat.h>
#include <zstd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw::checkpoint {
namespace {

using ::testing::HasSubstr;

class ZarrTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pw-zarr-test.XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }
  std::string dir_;
};

std::vector<float> Iota(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.f);
  return v;
}

TEST_F(ZarrTest, DtypesRoundTripAndOrbaxSpellingsParse) {
  for (int t = 1; t <= static_cast<int>(DType::kLast); ++t) {
    auto name = ZarrDtype(static_cast<DType>(t));
    ASSERT_TRUE(name.ok()) << t;
    EXPECT_EQ(*DTypeOfZarr(*name), static_cast<DType>(t));
  }
  EXPECT_EQ(*DTypeOfZarr("<u1"), DType::kU8);
  EXPECT_EQ(*DTypeOfZarr("f4"), DType::kF32);
  EXPECT_THAT(DTypeOfZarr(">f4").status().message(), HasSubstr("\">f4\" is not supported"));
}

TEST_F(ZarrTest, MetadataIsOrbaxsAndParsesBack) {
  ZarrArray z{{DType::kF32, Shape({6, 4})}, Shape({3, 2})};
  EXPECT_EQ(z.ToJson(),
            "{\"chunks\":[3,2],\"compressor\":null,\"dimension_separator\":\".\",\"dtype\":\"<f4\","
            "\"fill_value\":null,\"filters\":null,\"order\":\"C\",\"shape\":[6,4],"
            "\"zarr_format\":2}");
  auto back = ZarrArray::Parse(z.ToJson(), "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->spec, z.spec);
  EXPECT_EQ(back->chunks, z.chunks);
  EXPECT_FALSE(back->zstd);
  EXPECT_EQ(z.ChunkKey({3, 2}), "1.1");
  EXPECT_EQ(ZarrArray{}.ChunkKey({}), "0");
}

TEST_F(ZarrTest, BadMetadataIsRefusedNamingTheFileAndWhy) {
  auto parse = [](std::string json) { return ZarrArray::Parse(json, "ck/w/.zarray").status(); };
  EXPECT_THAT(parse("nonsense").message(), HasSubstr("ck/w/.zarray: not a JSON object"));
  EXPECT_THAT(parse(R"({"zarr_format":3})").message(), HasSubstr("not zarr_format 2"));
  // Fields of the wrong type are errors, not exceptions.
  EXPECT_THAT(parse(R"({"zarr_format":"2"})").message(), HasSubstr("not zarr_format 2"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[1],"dtype":"<f4","order":3})")
                  .message(),
              HasSubstr("order"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[1],"dtype":"<f4",
                        "compressor":{"id":7}})")
                  .message(),
              HasSubstr("neither null nor zstd"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[1],"dtype":5})").message(),
              HasSubstr("no dtype"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[1],"dtype":"<f4",
                        "dimension_separator":[]})")
                  .message(),
              HasSubstr("dimension_separator"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[1],"dtype":"<f4",
                        "fill_value":"NaN"})")
                  .message(),
              HasSubstr("fill_value"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[0,281474976710656,281474976710656],
                        "chunks":[1,281474976710656,281474976710656],"dtype":"<f4"})")
                  .message(),
              HasSubstr("a chunk is larger than 4294967296 bytes"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[1,1],"dtype":"<f4"})").message(),
              HasSubstr("differ in rank"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[0],"dtype":"<f4"})").message(),
              HasSubstr("not positive"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[1],"dtype":"<f4","order":"F"})")
                  .message(),
              HasSubstr("order"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[1],"dtype":"<f4",
                        "compressor":{"id":"blosc"}})")
                  .message(),
              HasSubstr("neither null nor zstd"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[2],"chunks":[3],"dtype":"<f4"})").message(),
              HasSubstr("a chunk is larger than the array"));
  EXPECT_THAT(parse(R"({"zarr_format":2,"shape":[4294967296],"chunks":[4294967296],
                        "dtype":"<f4"})")
                  .message(),
              HasSubstr("a chunk is larger than 4294967296 bytes"));
}

TEST_F(ZarrTest, ChunksWrittenPerShardReadBackInAnyRegion) {
  // A 6x4 array in 3x2 chunks (a 2x2 mesh's shards), read back whole and as other regions.
  ZarrArray z{{DType::kF32, Shape({6, 4})}, Shape({3, 2})};
  ASSERT_TRUE(WriteZarray(dir_, z).ok());
  const std::vector<float> all = Iota(24);
  const Box whole{{0, 0}, {6, 4}};
  for (int64_t r = 0; r < 6; r += 3) {
    for (int64_t c = 0; c < 4; c += 2) {
      Box b{{r, c}, {r + 3, c + 2}};
      std::vector<float> shard(6);
      CopyBoxIntersection(all.data(), whole, shard.data(), b, 4);
      ASSERT_TRUE(WriteChunk(dir_, z, b, shard.data()).ok());
    }
  }
  auto z2 = ReadZarray(dir_);
  ASSERT_TRUE(z2.ok()) << z2.status();
  std::vector<float> back(24);
  ASSERT_TRUE(ReadRegion(dir_, *z2, whole, back.data()).ok());
  EXPECT_EQ(back, all);
  // Rows 2..5 of column 1..2: four chunks contribute.
  std::vector<float> part(8);
  ASSERT_TRUE(ReadRegion(dir_, *z2, Box{{2, 1}, {6, 3}}, part.data()).ok());
  EXPECT_EQ(part, (std::vector<float>{9, 10, 13, 14, 17, 18, 21, 22}));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/1.1"));
  // One whole chunk (read straight into the destination).
  std::vector<float> one(6);
  ASSERT_TRUE(ReadRegion(dir_, *z2, Box{{3, 2}, {6, 4}}, one.data()).ok());
  EXPECT_EQ(one, (std::vector<float>{14, 15, 18, 19, 22, 23}));
}

TEST_F(ZarrTest, EdgeChunksArePaddedAndAScalarIsChunkZero) {
  ZarrArray z{{DType::kF32, Shape({5})}, Shape({2})};
  const std::vector<float> all = Iota(5);
  for (int64_t s = 0; s < 5; s += 2)
    ASSERT_TRUE(WriteChunk(dir_, z, Box{{s}, {std::min<int64_t>(s + 2, 5)}}, &all[s]).ok());
  EXPECT_EQ(std::filesystem::file_size(dir_ + "/2"), 8u);
  std::vector<float> back(5);
  ASSERT_TRUE(ReadRegion(dir_, z, Box{{0}, {5}}, back.data()).ok());
  EXPECT_EQ(back, all);
  EXPECT_THAT(WriteChunk(dir_, z, Box{{1}, {3}}, all.data()).message(),
              HasSubstr("not a chunk of f32[5]"));

  ZarrArray s{{DType::kS32, Shape({})}, Shape({})};
  const int32_t seven = 7;
  ASSERT_TRUE(WriteChunk(dir_, s, Box{}, &seven).ok());
  int32_t got = 0;
  ASSERT_TRUE(ReadRegion(dir_, s, Box{}, &got).ok());
  EXPECT_EQ(got, 7);
}

TEST_F(ZarrTest, ZstdChunksAreReadAndDamagedOrMissingOnesNamed) {
  ZarrArray z{{DType::kF32, Shape({4})}, Shape({2})};
  z.zstd = true;
  const std::vector<float> a = {1, 2, 3, 4};
  for (int i = 0; i < 2; ++i) {
    std::string out(ZSTD_compressBound(8), '\0');
    out.resize(ZSTD_compress(out.data(), out.size(), &a[2 * i], 8, 1));
    Write(std::to_string(i), out);
  }
  std::vector<float> back(4);
  ASSERT_TRUE(ReadRegion(dir_, z, Box{{0}, {4}}, back.data()).ok());
  EXPECT_EQ(back, a);
  Write("1", "garbage");
  EXPECT_THAT(ReadRegion(dir_, z, Box{{0}, {4}}, back.data()).message(),
              HasSubstr(dir_ + "/1: zstd:"));
  std::filesystem::remove(dir_ + "/1");  // Not there: the fill value, zeros.
  ASSERT_TRUE(ReadRegion(dir_, z, Box{{0}, {4}}, back.data()).ok());
  EXPECT_EQ(back, (std::vector<float>{1, 2, 0, 0}));
  ASSERT_EQ(mkfifo((dir_ + "/1").c_str(), 0600), 0);  // Would block a reader: refused.
  EXPECT_THAT(std::string(ReadRegion(dir_, z, Box{{0}, {4}}, back.data()).message()),
              HasSubstr(dir_ + "/1 is not a regular file"));
  z.zstd = false;
  Write("0", "short");
  EXPECT_THAT(ReadRegion(dir_, z, Box{{0}, {2}}, back.data()).message(),
              HasSubstr("holds 5 bytes, not 8"));
  Write("0", "twelve bytes");
  EXPECT_THAT(ReadRegion(dir_, z, Box{{0}, {2}}, back.data()).message(),
              HasSubstr("holds more than 8 bytes"));
  EXPECT_THAT(ReadRegion(dir_, z, Box{{0}, {1}}, back.data()).message(),
              HasSubstr("holds more than 8 bytes"));
}

}  // namespace
}  // namespace pw::checkpoint
