#include "pw/dataplane/peer_channel.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/base/future.h"
#include "pw/dataplane/bulk_server.h"

namespace pw::dataplane {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Reads `where` on `fetch` and waits for its `done`.
absl::Status ReadAll(PeerChannel::Fetch& fetch, const ShardLocation& where, std::string& dst) {
  Promise<> read;
  Future<> f = read.future();
  fetch.Read(where, dst.data(), dst.size(), [&read](const absl::Status& s) { read.Set(s); });
  return f.Await();
}

TEST(PeerChannelTest, SharedMemoryFillsAPoolThatLaterShardsReuse) {
  auto channel = PeerChannel::SharedMemory();
  ShmWriterCache writer;
  const std::string shard(3 << 20, 's');

  // The pool starts empty: the writer makes a one-transfer segment, and the pool grows after.
  auto first = PeerChannel::Begin(channel);
  EXPECT_THAT(first->offered(), IsEmpty());
  auto placed = PlaceInSharedMemory(writer, first->offered(), shard.data(), shard.size());
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(placed->segment, Not(IsEmpty()));
  std::string got(shard.size(), '\0');
  ASSERT_TRUE(ReadAll(*first, *placed, got).ok());
  EXPECT_EQ(got, shard);
  first->Succeeded(shard.size());
  first.reset();

  // Next time the reader offers a pool segment, and the shard is written straight into it.
  auto second = PeerChannel::Begin(channel);
  ASSERT_THAT(second->offered(), Not(IsEmpty()));
  placed = PlaceInSharedMemory(writer, second->offered(), shard.data(), shard.size());
  ASSERT_TRUE(placed.ok());
  EXPECT_THAT(placed->segment, IsEmpty()) << "not written into the offered segment";
  got.assign(shard.size(), '\0');
  ASSERT_TRUE(ReadAll(*second, *placed, got).ok());
  EXPECT_EQ(got, shard);

  // One location per fetch, of its own medium.
  EXPECT_TRUE(absl::IsDataLoss(ReadAll(*second, *placed, got)));
  auto third = PeerChannel::Begin(channel);
  absl::Status bulk = ReadAll(*third, OnBulkStream{1, 1}, got);
  EXPECT_TRUE(absl::IsDataLoss(bulk));
  EXPECT_THAT(bulk.message(), HasSubstr("did not ask for"));
}

TEST(PeerChannelTest, AnOfferedSegmentTooSmallFallsBackToAFreshOne) {
  auto channel = PeerChannel::SharedMemory();
  ShmWriterCache writer;
  const std::string small(1 << 20, 'a');
  auto warm = PeerChannel::Begin(channel);
  auto placed = PlaceInSharedMemory(writer, warm->offered(), small.data(), small.size());
  ASSERT_TRUE(placed.ok());
  std::string got(small.size(), '\0');
  ASSERT_TRUE(ReadAll(*warm, *placed, got).ok());
  warm->Succeeded(small.size());
  warm.reset();

  const std::string big(5 << 20, 'b');
  auto fetch = PeerChannel::Begin(channel);
  const std::string offered = fetch->offered();
  ASSERT_THAT(offered, Not(IsEmpty()));
  placed = PlaceInSharedMemory(writer, offered, big.data(), big.size());
  ASSERT_TRUE(placed.ok());
  EXPECT_THAT(placed->dest_error, HasSubstr("need"));
  EXPECT_THAT(placed->segment, Not(IsEmpty()));
  got.assign(big.size(), '\0');
  ASSERT_TRUE(ReadAll(*fetch, *placed, got).ok());
  EXPECT_EQ(got, big);
}

// Warms `channel`'s pool with one segment that holds `size` bytes.
void WarmPool(const std::shared_ptr<PeerChannel>& channel, ShmWriterCache& writer, size_t size) {
  const std::string shard(size, 'w');
  auto warm = PeerChannel::Begin(channel);
  auto placed = PlaceInSharedMemory(writer, warm->offered(), shard.data(), shard.size());
  ASSERT_TRUE(placed.ok()) << placed.status();
  std::string got(size, '\0');
  ASSERT_TRUE(ReadAll(*warm, *placed, got).ok());
  warm->Succeeded(size);
}

TEST(PeerChannelTest, AShardInTheOfferedSegmentIsAdoptedAndItsSegmentComesBackWhenLetGo) {
  auto channel = PeerChannel::SharedMemory();
  ShmWriterCache writer;
  const std::string shard(3 << 20, 'a');  // The pool's segment: 4 MiB.
  WarmPool(channel, writer, shard.size());

  auto fetch = PeerChannel::Begin(channel);
  const std::string segment = fetch->offered();
  ASSERT_THAT(segment, Not(IsEmpty()));
  auto placed = PlaceInSharedMemory(writer, segment, shard.data(), shard.size());
  ASSERT_TRUE(placed.ok());
  std::shared_ptr<void> memory = fetch->Adopt(*placed, shard.size());
  ASSERT_NE(memory, nullptr);
  EXPECT_EQ(std::string(static_cast<const char*>(memory.get()), shard.size()), shard);
  // Read or adopt: one of them, once.
  std::string got(shard.size(), '\0');
  EXPECT_TRUE(absl::IsDataLoss(ReadAll(*fetch, *placed, got)));
  EXPECT_EQ(fetch->Adopt(*placed, shard.size()), nullptr);
  fetch.reset();

  // While the shard holds the segment, no fetch is offered it.
  EXPECT_THAT(PeerChannel::Begin(channel)->offered(), IsEmpty());
  memory.reset();
  EXPECT_EQ(PeerChannel::Begin(channel)->offered(), segment);
}

TEST(PeerChannelTest, AShardFarSmallerThanItsSegmentOrInAFreshOneIsCopied) {
  auto channel = PeerChannel::SharedMemory();
  ShmWriterCache writer;
  WarmPool(channel, writer, 16 << 20);
  const std::string small(1 << 20, 's');
  auto fetch = PeerChannel::Begin(channel);
  auto placed = PlaceInSharedMemory(writer, fetch->offered(), small.data(), small.size());
  ASSERT_TRUE(placed.ok());
  ASSERT_THAT(placed->segment, IsEmpty());
  EXPECT_EQ(fetch->Adopt(*placed, small.size()), nullptr) << "1 MiB would hold 16 MiB";
  std::string got(small.size(), '\0');
  ASSERT_TRUE(ReadAll(*fetch, *placed, got).ok());
  EXPECT_EQ(got, small);

  auto fresh = PeerChannel::Begin(PeerChannel::SharedMemory());  // An empty pool.
  placed = PlaceInSharedMemory(writer, fresh->offered(), small.data(), small.size());
  ASSERT_TRUE(placed.ok());
  ASSERT_THAT(placed->segment, Not(IsEmpty()));
  EXPECT_EQ(fresh->Adopt(*placed, small.size()), nullptr);
  ASSERT_TRUE(ReadAll(*fresh, *placed, got).ok());
  EXPECT_EQ(got, small);
}

TEST(PeerChannelTest, AnAdoptedSegmentOutlivesItsClosedChannelAndIsUnlinkedWhenLetGo) {
  auto channel = PeerChannel::SharedMemory();
  ShmWriterCache writer;
  const std::string shard(3 << 20, 'c');
  WarmPool(channel, writer, shard.size());
  auto fetch = PeerChannel::Begin(channel);
  const std::string segment = fetch->offered();
  auto placed = PlaceInSharedMemory(writer, segment, shard.data(), shard.size());
  ASSERT_TRUE(placed.ok());
  std::shared_ptr<void> memory = fetch->Adopt(*placed, shard.size());
  ASSERT_NE(memory, nullptr);
  fetch.reset();
  channel->Close();
  channel.reset();
  EXPECT_EQ(static_cast<const char*>(memory.get())[shard.size() - 1], 'c');
  memory.reset();
  EXPECT_TRUE(absl::IsNotFound(
      ShmWriterCache().Write(segment, shard.data(), 1)))  // A fresh cache: opens by name.
      << "the segment should be unlinked";
}

TEST(PeerChannelTest, BulkStreamReadsAnOfferAndRefusesBadTickets) {
  auto server = BulkServer::Start("127.0.0.1", 0, "cluster-token");
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = PeerChannel::Bulk("127.0.0.1", "cluster-token", nullptr);
  auto bytes = std::make_shared<std::string>(2 << 20, 'x');
  Promise<> sent;
  Future<> sent_f = sent.future();
  const uint64_t ticket = (*server)->Offer(bytes, bytes->data(), bytes->size(),
                                           [&sent](const absl::Status& s) { sent.Set(s); });
  auto fetch = PeerChannel::Begin(channel);
  EXPECT_THAT(fetch->offered(), IsEmpty());
  std::string got(bytes->size(), '\0');
  ASSERT_TRUE(ReadAll(*fetch, OnBulkStream{ticket, (*server)->port()}, got).ok());
  EXPECT_EQ(got, *bytes);
  EXPECT_TRUE(sent_f.Await().ok());

  auto bad = PeerChannel::Begin(channel);
  absl::Status zero = ReadAll(*bad, OnBulkStream{0, (*server)->port()}, got);
  EXPECT_TRUE(absl::IsDataLoss(zero));
  EXPECT_THAT(zero.message(), HasSubstr("bulk ticket 0"));
  auto shm = PeerChannel::Begin(channel);
  EXPECT_TRUE(absl::IsDataLoss(ReadAll(*shm, InSharedMemory{"/pw-xfer-1-x", ""}, got)));
  // A ticket the server never offered: the server's error comes back.
  auto unknown = PeerChannel::Begin(channel);
  EXPECT_FALSE(ReadAll(*unknown, OnBulkStream{ticket + 1000, (*server)->port()}, got).ok());
}

}  // namespace
}  // namespace pw::dataplane
