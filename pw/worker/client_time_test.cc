#include "pw/worker/client_time.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

// A sample in the middle of a computation counts the part of it run so far: device time as it is
// spent, not in steps at each computation's end.
TEST(ClientTimeTest, ASnapshotCountsTheRunningPartOfEachDevicesComputation) {
  ClientTime t({DeviceId(0), DeviceId(1)});
  EXPECT_THAT(t.Snapshot(100), IsEmpty());
  t.Start(DeviceId(0), ClientId(7), 1000);
  t.Start(DeviceId(1), ClientId(8), 1200);
  EXPECT_THAT(t.Snapshot(1500), ElementsAre(Pair(ClientId(7), 500), Pair(ClientId(8), 300)));
  EXPECT_EQ(t.Stop(DeviceId(0), 1600), 600);
  EXPECT_THAT(t.Snapshot(1700), ElementsAre(Pair(ClientId(7), 600), Pair(ClientId(8), 500)));
  // The next computation on device 0 adds to what client 7 finished.
  t.Start(DeviceId(0), ClientId(7), 2000);
  EXPECT_THAT(t.Snapshot(2050), ElementsAre(Pair(ClientId(7), 650), Pair(ClientId(8), 850)));
  EXPECT_EQ(t.Stop(DeviceId(0), 2100), 100);
  EXPECT_EQ(t.Stop(DeviceId(1), 2100), 900);
  // Nothing running: the totals stand still.
  EXPECT_THAT(t.Snapshot(9000), ElementsAre(Pair(ClientId(7), 700), Pair(ClientId(8), 900)));
}

TEST(ClientTimeTest, AStopWithoutAStartAndAnotherHostsDeviceAddNothing) {
  ClientTime t({DeviceId(3)});
  EXPECT_EQ(t.Stop(DeviceId(3), 500), 0);
  t.Start(DeviceId(9), ClientId(1), 500);  // Not this host's.
  EXPECT_EQ(t.Stop(DeviceId(9), 700), 0);
  EXPECT_THAT(t.Snapshot(800), IsEmpty());
}

}  // namespace
}  // namespace pw
