#include "pw/dataplane/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw::dataplane {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ShmSegmentTest, CreatedSegmentIsOpenedByNameOfItsKindOnly) {
  auto made = ShmSegment::Create(ShmKind::kArena, 4096);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_THAT((*made)->name(), StartsWith(absl::StrCat("/pw-arena-", getpid(), "-")));
  std::memcpy((*made)->data(), "bytes", 5);

  auto opened = ShmSegment::Open(ShmKind::kArena, (*made)->name());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->capacity(), 4096u);
  EXPECT_EQ(std::memcmp((*opened)->data(), "bytes", 5), 0);

  // Another kind's name, or something else in /dev/shm: refused, naming it.
  auto wrong = ShmSegment::Open(ShmKind::kMailbox, (*made)->name());
  EXPECT_TRUE(absl::IsInvalidArgument(wrong.status()));
  EXPECT_THAT(wrong.status().message(), HasSubstr((*made)->name()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(ShmSegment::Open(ShmKind::kArena, "/pw-arena-1/../x").status()));

  (*made)->Unlink();
  EXPECT_TRUE(absl::IsNotFound(ShmSegment::Open(ShmKind::kArena, (*made)->name()).status()));
  EXPECT_EQ(std::memcmp((*opened)->data(), "bytes", 5), 0) << "a mapping outlives the name";
}

TEST(ShmSegmentTest, OneTransferSegmentIsReadOnceAndGone) {
  const std::string data = "a shard's bytes";
  auto name = WriteSharedMemory(data.data(), data.size());
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_THAT(*name, StartsWith("/pw-xfer-"));
  std::string got(data.size(), '\0');
  ASSERT_TRUE(ReadSharedMemory(*name, got.data(), got.size()).ok());
  EXPECT_EQ(got, data);
  EXPECT_TRUE(absl::IsNotFound(ReadSharedMemory(*name, got.data(), got.size())));

  // A size that does not match: an error naming both, and the segment is gone all the same.
  name = WriteSharedMemory(data.data(), data.size());
  ASSERT_TRUE(name.ok());
  absl::Status wrong = ReadSharedMemory(*name, got.data(), 3);
  EXPECT_TRUE(absl::IsDataLoss(wrong));
  EXPECT_THAT(wrong.message(),
              HasSubstr(absl::StrCat("holds ", data.size(), " bytes, expected 3")));
  EXPECT_TRUE(absl::IsNotFound(ShmSegment::Open(ShmKind::kTransfer, *name).status()));

  // Empty shards travel too; a segment nobody reads can be withdrawn.
  name = WriteSharedMemory(nullptr, 0);
  ASSERT_TRUE(name.ok());
  EXPECT_TRUE(ReadSharedMemory(*name, nullptr, 0).ok());
  name = WriteSharedMemory(data.data(), data.size());
  ASSERT_TRUE(name.ok());
  UnlinkSharedMemory(*name);
  EXPECT_TRUE(absl::IsNotFound(ReadSharedMemory(*name, got.data(), got.size())));
}

// A segment that cannot be made (here: far more bytes than the address space) is an error
// naming it, and leaves nothing behind in /dev/shm.
TEST(ShmSegmentTest, ASegmentThatCannotBeMadeLeavesNothing) {
  const auto ours = [] {
    int n = 0;
    const std::string prefix = absl::StrCat("pw-xfer-", getpid(), "-");
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      n += e.path().filename().string().rfind(prefix, 0) == 0;
    return n;
  };
  const int before = ours();
  auto made = ShmSegment::Create(ShmKind::kTransfer, size_t{1} << 62);
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(made.status().message(), HasSubstr(absl::StrCat("/pw-xfer-", getpid(), "-")));
  EXPECT_EQ(ours(), before);
  std::string bytes(16, 'x');
  EXPECT_FALSE(WriteSharedMemory(bytes.data(), size_t{1} << 62).ok());
  EXPECT_EQ(ours(), before);
}

TEST(ShmSegmentTest, StaleSegmentsOfDeadProcessesAreRemoved) {
  // Every kind, of a pid that cannot be alive (above the kernel's maximum), and one of ours.
  const std::string live = absl::StrCat("/pw-arena-", getpid(), "-test");
  const std::string dead[] = {"/pw-mbox-2147483640-test", "/pw-arena-2147483640-test",
                              "/pw-xfer-2147483640-test"};
  const std::string foreign = "/pw-other-2147483640-test";  // Not a kind of ours: left alone.
  for (const std::string& n : {live, dead[0], dead[1], dead[2], foreign}) {
    const int fd = shm_open(n.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << n;
    close(fd);
  }
  // Another test process starting a worker at the same time may remove them first: the count is
  // not checked, only what is gone.
  RemoveStaleSegments();
  for (const std::string& n : dead)
    EXPECT_LT(shm_open(n.c_str(), O_RDONLY, 0), 0) << n << " of a dead process is still there";
  for (const std::string& n : {live, foreign}) {
    const int fd = shm_open(n.c_str(), O_RDONLY, 0);
    EXPECT_GE(fd, 0) << n << " was removed";
    if (fd >= 0) close(fd);
  }
  // A process that replaced its image (a worker restarting in place) removes its own old ones.
  RemoveStaleSegments(/*this_process=*/true);
  EXPECT_LT(shm_open(live.c_str(), O_RDONLY, 0), 0) << "this pid's old segment is still there";
  shm_unlink(live.c_str());
  shm_unlink(foreign.c_str());
}

}  // namespace
}  // namespace pw::dataplane
