#include "pw/rpc/batch_queue.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/rpc/proto/pathways.pb.h"

namespace pw::rpc {
namespace {
namespace v1 = ::pathways::v1;
using ::testing::ElementsAre;
using ::testing::IsNull;
using ::testing::NotNull;

v1::Command Cmd(uint64_t seq, size_t payload = 0) {
  v1::Command c;
  c.set_seq(seq);
  if (payload > 0) c.mutable_put_shard()->mutable_shard()->mutable_data()->assign(payload, 'x');
  return c;
}

std::vector<uint64_t> Seqs(const v1::CommandBatch* b) {
  std::vector<uint64_t> out;
  for (const v1::Command& c : b->items()) out.push_back(c.seq());
  return out;
}

TEST(BatchQueueTest, TheFirstItemGoesAloneAndThoseQueuedDuringItsWriteGoTogether) {
  BatchQueue<v1::CommandBatch> q;
  EXPECT_THAT(q.StartNext(), IsNull());
  q.Push(Cmd(1));
  v1::CommandBatch* first = q.StartNext();
  ASSERT_THAT(first, NotNull());
  EXPECT_THAT(Seqs(first), ElementsAre(1));
  for (uint64_t s = 2; s <= 5; ++s) q.Push(Cmd(s));
  EXPECT_THAT(q.StartNext(), IsNull());  // One write at a time.
  EXPECT_THAT(Seqs(first), ElementsAre(1));  // The batch being written does not grow.
  q.WriteDone();
  v1::CommandBatch* second = q.StartNext();
  ASSERT_THAT(second, NotNull());
  EXPECT_THAT(Seqs(second), ElementsAre(2, 3, 4, 5));
  q.WriteDone();
  EXPECT_THAT(q.StartNext(), IsNull());
  EXPECT_TRUE(q.empty());
}

TEST(BatchQueueTest, ABatchHoldsAtMostItsItemsAndBytesAndALargeItemGoesAlone) {
  using Q = BatchQueue<v1::CommandBatch>;
  Q q;
  q.Push(Cmd(0));
  ASSERT_THAT(q.StartNext(), NotNull());
  for (uint64_t s = 1; s <= Q::kMaxItems + 1; ++s) q.Push(Cmd(s));
  q.Push(Cmd(1000, Q::kMaxBytes + 1));
  q.Push(Cmd(1001));
  q.WriteDone();
  EXPECT_TRUE(q.more());
  EXPECT_EQ(q.StartNext()->items_size(), Q::kMaxItems);
  q.WriteDone();
  EXPECT_THAT(Seqs(q.StartNext()), ElementsAre(Q::kMaxItems + 1));
  q.WriteDone();
  EXPECT_THAT(Seqs(q.StartNext()), ElementsAre(1000));
  q.WriteDone();
  EXPECT_THAT(Seqs(q.StartNext()), ElementsAre(1001));
}

TEST(BatchQueueTest, OnlyWaitingItemsCanBeAddedToOrDropped) {
  BatchQueue<v1::CommandBatch> q;
  EXPECT_THAT(q.LastWaiting(), IsNull());
  q.Push(Cmd(1));
  ASSERT_THAT(q.LastWaiting(), NotNull());
  EXPECT_EQ(q.LastWaiting()->seq(), 1u);
  v1::CommandBatch* writing = q.StartNext();
  EXPECT_THAT(q.LastWaiting(), IsNull());  // Item 1 is being written.
  q.Push(Cmd(2));
  EXPECT_EQ(q.LastWaiting()->seq(), 2u);
  q.DropWaiting();
  EXPECT_TRUE(q.writing());
  EXPECT_THAT(Seqs(writing), ElementsAre(1));  // gRPC still reads it.
  q.WriteDone();
  EXPECT_TRUE(q.empty());
  EXPECT_FALSE(q.writing());
}

TEST(BatchQueueTest, GrowingAWaitingItemPastTheBytesStartsANewBatch) {
  BatchQueue<v1::CommandBatch> q;
  q.Push(Cmd(0));
  ASSERT_THAT(q.StartNext(), NotNull());
  q.Push(Cmd(1));
  q.Push(Cmd(2));
  q.Grew(BatchQueue<v1::CommandBatch>::kMaxBytes);
  q.Push(Cmd(3));
  q.WriteDone();
  EXPECT_THAT(Seqs(q.StartNext()), ElementsAre(1, 2));
  q.WriteDone();
  EXPECT_THAT(Seqs(q.StartNext()), ElementsAre(3));
}

// bytes(): what is queued and not yet written, the batch being written included; a reader that
// does not read is what makes it grow (ControllerService ends such a session past a limit).
TEST(BatchQueueTest, BytesCountWhatIsNotYetWritten) {
  BatchQueue<v1::CommandBatch> q;
  EXPECT_EQ(q.bytes(), 0u);
  q.Push(Cmd(7, 1000));
  const size_t one = q.bytes();
  EXPECT_GT(one, 1000u);
  ASSERT_THAT(q.StartNext(), NotNull());
  q.Push(Cmd(7, 1000));
  q.Push(Cmd(7, 1000));
  EXPECT_EQ(q.bytes(), 3 * one);
  q.Grew(10);
  EXPECT_EQ(q.bytes(), 3 * one + 10);
  q.DropWaiting();  // The batch being written stays.
  EXPECT_EQ(q.bytes(), one);
  q.Push(Cmd(7, 1000));
  q.WriteDone();
  EXPECT_EQ(q.bytes(), one);
  ASSERT_THAT(q.StartNext(), NotNull());
  q.WriteDone();
  EXPECT_EQ(q.bytes(), 0u);
}

}  // namespace
}  // namespace pw::rpc
