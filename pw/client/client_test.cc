#include "pw/client/client.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/transport/mock_controller.h"

namespace pw {
namespace {

using ::testing::_;
using ::testing::Return;

// An Array dropped while it is read or saved is released when the read ends, and before whoever
// waits for the result hears of it: they may destroy the controller next. (The handle was
// dropped with the controller's future's callbacks, after the waiter had been woken: a release
// through a destroyed controller.)
TEST(ArrayTest, ADroppedArrayIsReleasedBeforeItsFetchOrSaveIsAnswered) {
  MockController c;
  EXPECT_CALL(c, Connect(_, _)).WillOnce(Return(ClientId(1)));
  EXPECT_CALL(c, Disconnect(ClientId(1))).WillOnce(Return(absl::OkStatus()));
  auto client = *Client::Connect(&c, "c");
  const ArraySpec spec{DType::kF32, Shape({1})};
  Promise<HostArray> fetched;
  Promise<> saved;
  EXPECT_CALL(c, PutArray(_, _, _, _))
      .WillOnce(Return(ArrayInfo{BufferId(7), spec, Sharding(), SliceId(1), {}, {}}))
      .WillOnce(Return(ArrayInfo{BufferId(8), spec, Sharding(), SliceId(1), {}, {}}));
  EXPECT_CALL(c, FetchArray(ClientId(1), BufferId(7))).WillOnce(Return(fetched.future()));
  EXPECT_CALL(c, SaveArray(ClientId(1), BufferId(8), "/ckpt")).WillOnce(Return(saved.future()));
  std::vector<int> released_before_answer;
  bool answered = false;
  EXPECT_CALL(c, ReleaseArray(ClientId(1), _))
      .Times(2)
      .WillRepeatedly([&](ClientId, BufferId id) {
        if (!answered) released_before_answer.push_back(static_cast<int>(id.value()));
        return absl::OkStatus();
      });
  HostArray one{spec, Bytes(4, 0)};
  std::optional<Array> read(*client->Put(one, SliceId(1), Sharding()));
  std::optional<Array> kept(*client->Put(one, SliceId(1), Sharding()));
  Future<HostArray> got = read->ToHostAsync();
  Future<> done = kept->Save("/ckpt");
  read.reset();  // Only the read holds them now.
  kept.reset();
  got.OnReady([&](const absl::StatusOr<HostArray>&) { answered = true; });
  fetched.Set(one);
  EXPECT_TRUE(answered);
  answered = false;
  done.OnReady([&](const absl::Status&) { answered = true; });
  saved.Set(absl::OkStatus());
  EXPECT_TRUE(answered);
  EXPECT_EQ(released_before_answer, (std::vector<int>{7, 8}));
}

}  // namespace
}  // namespace pw
