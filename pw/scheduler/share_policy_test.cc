// SharePolicy (start-time fair queueing over device time) without a scheduler: requests are
// added and popped by the test, and "finish" when the test says, so every order is exact.
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pw/scheduler/scheduling_policy.h"

namespace pw {
namespace {

std::shared_ptr<Tenant> T(int64_t id, double share) {
  return std::make_shared<Tenant>(id, "t" + std::to_string(id), share);
}

std::unique_ptr<ScheduleRequest> Req(const std::shared_ptr<Tenant>& t, int64_t cost,
                                     int64_t seq = 0, bool spans = false, int64_t run = 0) {
  auto r = std::make_unique<ScheduleRequest>();
  r->work.tenant = t;
  r->work.seq = seq;
  r->work.spans_islands = spans;
  r->work.run = RunId(run);
  r->estimated_ns = cost;
  return r;
}

// Pops the next request, which the test expects to be `tenant`'s (null if none may go).
std::unique_ptr<ScheduleRequest> PopOf(SharePolicy& p, const std::shared_ptr<Tenant>& tenant) {
  const ScheduleRequest* next = p.Peek();
  EXPECT_NE(next, nullptr);
  if (next == nullptr) return nullptr;
  EXPECT_EQ(next->work.tenant->id(), tenant->id());
  return p.Pop();
}

// Pops `n` requests, keeping every tenant backlogged (each pop is replaced by one more of the
// same tenant); returns how many each tenant got.
std::map<int64_t, int> PopBacklogged(SharePolicy& p, int n, int64_t cost) {
  std::map<int64_t, int> got;
  for (int i = 0; i < n; ++i) {
    const ScheduleRequest* next = p.Peek();
    EXPECT_NE(next, nullptr);
    if (next == nullptr) break;
    std::unique_ptr<ScheduleRequest> r = p.Pop();
    ++got[r->work.tenant->id()];
    p.Finished(*r, r->estimated_ns);
    p.Add(Req(std::const_pointer_cast<Tenant>(r->work.tenant), cost));
  }
  return got;
}

TEST(SharePolicyTest, BackloggedTenantsGetDeviceTimeInProportionToTheirShares) {
  SharePolicy p;
  std::vector<std::shared_ptr<Tenant>> tenants = {T(0, 1), T(1, 2), T(2, 4), T(3, 8)};
  for (auto& t : tenants) p.Add(Req(t, 1000));
  std::map<int64_t, int> got = PopBacklogged(p, 1500, 1000);
  // 1500 requests at 1:2:4:8 are 100, 200, 400, 800, each within one request.
  EXPECT_NEAR(got[0], 100, 1);
  EXPECT_NEAR(got[1], 200, 1);
  EXPECT_NEAR(got[2], 400, 1);
  EXPECT_NEAR(got[3], 800, 1);
  // And in every stretch of 150 (a tenth), each is within one request of its share of it.
  SharePolicy q;
  for (auto& t : tenants) q.Add(Req(t, 1000));
  for (int window = 0; window < 10; ++window) {
    std::map<int64_t, int> w = PopBacklogged(q, 150, 1000);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(w[i], 10 << i, 1) << "window " << window;
  }
}

TEST(SharePolicyTest, SharesAreOfDeviceTimeNotOfRequests) {
  // Tenant 1's requests cost three times tenant 0's: at equal shares it gets a third as many.
  SharePolicy p;
  auto cheap = T(0, 1), dear = T(1, 1);
  p.Add(Req(cheap, 100));
  p.Add(Req(dear, 300));
  std::map<int64_t, int> got;
  for (int i = 0; i < 400; ++i) {
    ASSERT_NE(p.Peek(), nullptr);
    std::unique_ptr<ScheduleRequest> r = p.Pop();
    const int64_t id = r->work.tenant->id();
    ++got[id];
    p.Add(Req(id == 0 ? cheap : dear, id == 0 ? 100 : 300));
  }
  EXPECT_NEAR(got[0], 300, 2);
  EXPECT_NEAR(got[1], 100, 2);
}

TEST(SharePolicyTest, MeasuredTimeCorrectsWrongEstimates) {
  // Both estimated at 100, but tenant 1's requests take 200 when measured: its share of device
  // time, not of requests, stays equal.
  SharePolicy p;
  auto a = T(0, 1), b = T(1, 1);
  p.Add(Req(a, 100));
  p.Add(Req(b, 100));
  std::map<int64_t, int64_t> device_ns;
  for (int i = 0; i < 600; ++i) {
    ASSERT_NE(p.Peek(), nullptr);
    std::unique_ptr<ScheduleRequest> r = p.Pop();
    const int64_t id = r->work.tenant->id();
    const int64_t took = id == 0 ? 100 : 200;
    device_ns[id] += took;
    p.Finished(*r, took);
    p.Add(Req(id == 0 ? a : b, 100));
  }
  EXPECT_NEAR(static_cast<double>(device_ns[0]) / device_ns[1], 1.0, 0.02);
}

// Measured times scattered around the estimates (as short computations' are on a loaded host)
// with requests in flight: a request that took less than its estimate gives its tenant that time
// back, even where that moves its next request's start before the virtual time. (When the
// correction stopped at the virtual time, the credit a tenant lost depended on how close its
// next start was to it, which its share decides: here 1:8 became 1:8.7.)
TEST(SharePolicyTest, TimesScatteredAroundTheEstimatesKeepTheShares) {
  SharePolicy p;
  auto small = T(0, 1), large = T(1, 8);
  for (int i = 0; i < 8; ++i) {
    p.Add(Req(small, 1000));
    p.Add(Req(large, 1000));
  }
  std::mt19937 random(7);
  std::uniform_int_distribution<int64_t> took(100, 1900);  // Mean 1000, the estimate.
  std::deque<std::unique_ptr<ScheduleRequest>> in_flight;
  std::map<int64_t, int64_t> device_ns;
  double virtual_time = 0;
  for (int i = 0; i < 20000; ++i) {
    ASSERT_NE(p.Peek(), nullptr);
    in_flight.push_back(p.Pop());
    ASSERT_GE(p.virtual_time(), virtual_time);  // A credited head never moves it back.
    virtual_time = p.virtual_time();
    const auto& tenant = in_flight.back()->work.tenant;
    p.Add(Req(std::const_pointer_cast<Tenant>(tenant), 1000));
    if (in_flight.size() < 8) continue;
    std::unique_ptr<ScheduleRequest> r = std::move(in_flight.front());
    in_flight.pop_front();
    const int64_t t = took(random);
    device_ns[r->work.tenant->id()] += t;
    p.Finished(*r, t);
  }
  EXPECT_NEAR(static_cast<double>(device_ns[1]) / device_ns[0], 8.0, 0.25);
}

// A tenant whose queue emptied while its request ran restarts at the virtual time, and that
// request finishing under its estimate afterwards does not take it back before it: idleness
// earns nothing, even through a correction.
TEST(SharePolicyTest, ARequestFinishingAfterItsTenantWentIdleGivesNoCreditForTheIdleTime) {
  SharePolicy p;
  auto b = T(0, 1), a = T(1, 1);
  p.Add(Req(a, 1000));
  for (int i = 0; i < 5; ++i) p.Add(Req(b, 1000));
  PopOf(p, b);  // Both at 0: the lower id.
  std::unique_ptr<ScheduleRequest> a1 = PopOf(p, a);  // A's queue is empty now; a1 runs.
  ASSERT_NE(a1, nullptr);
  for (int i = 0; i < 2; ++i) PopOf(p, b);
  ASSERT_EQ(p.virtual_time(), 2000);
  p.Add(Req(a, 1000));  // A restarts at 2000, B's head is at 3000.
  p.Add(Req(a, 1000));
  p.Finished(*a1, 100);  // 900 under its estimate.
  PopOf(p, a);  // From 2000 (from 1100, A would go again next).
  EXPECT_EQ(p.Peek()->work.tenant, b);  // Both at 3000: the lower id.
}

// A tenant that was not idle (its finish still ahead of the virtual time when its queue
// refilled) keeps the credit of a request that finishes after the refill, as it would had the
// request finished before it.
TEST(SharePolicyTest, ARequestFinishingAfterItsTenantsQueueRefilledKeepsItsCredit) {
  SharePolicy p;
  auto b = T(0, 1), a = T(1, 1);
  p.Add(Req(a, 1000));
  for (int i = 0; i < 5; ++i) p.Add(Req(b, 200));
  PopOf(p, b);  // Both at 0: the lower id.
  std::unique_ptr<ScheduleRequest> a1 = PopOf(p, a);  // A's finish: 1000; its queue is empty.
  ASSERT_NE(a1, nullptr);
  PopOf(p, b);
  ASSERT_EQ(p.virtual_time(), 200);
  p.Add(Req(a, 1000));   // At 1000, A's finish.
  p.Finished(*a1, 100);  // 900 under: A's finish is 100, so its head goes to 200 (B's: 400).
  EXPECT_EQ(p.Peek()->work.tenant, a);
}

// A share changed while a request runs: its correction is at the share it was charged at.
TEST(SharePolicyTest, ARunningRequestIsCorrectedAtTheShareItWasChargedAt) {
  SharePolicy p;
  auto a = T(0, 100), b = T(1, 1);
  p.Add(Req(a, 1000));
  p.Add(Req(a, 1000));
  p.Add(Req(b, 1000));
  p.Add(Req(b, 1000));
  std::unique_ptr<ScheduleRequest> a1 = PopOf(p, a);  // Both at 0: the lower id. A's head: 10.
  ASSERT_NE(a1, nullptr);
  PopOf(p, b);  // B's head: 1000.
  a->set_share(1);
  p.Finished(*a1, 2000);  // 1000 over, at share 100: A's head moves to 20 (at share 1: 1010).
  EXPECT_EQ(p.Peek()->work.tenant, a);
}

// Idle tenants' entries are dropped once there are many, but not one whose request still runs:
// what that request took beyond its estimate is still charged when it finishes.
TEST(SharePolicyTest, AnIdleTenantsEntryStaysWhileItsRequestRuns) {
  SharePolicy p;
  for (int i = 0; i < 70; ++i) {  // Enough idle tenants that entries are dropped.
    p.Add(Req(T(10 + i, 1), 1000));
    ASSERT_NE(p.Peek(), nullptr);
    std::unique_ptr<ScheduleRequest> z = p.Pop();
    p.Finished(*z, 1000);
  }
  auto x = T(0, 1), y = T(1, 1);
  p.Add(Req(x, 1000));
  for (int i = 0; i < 5; ++i) p.Add(Req(y, 1000));
  // Both at 0: the lower id. X's queue is empty; x1 runs.
  std::unique_ptr<ScheduleRequest> x1 = PopOf(p, x);
  ASSERT_NE(x1, nullptr);
  // The idle entries go once the virtual time passes their finish times.
  for (int i = 0; i < 3; ++i) PopOf(p, y);
  ASSERT_EQ(p.virtual_time(), 2000);
  p.Finished(*x1, 5000);  // 4000 over: X's finish is 5000.
  p.Add(Req(x, 1000));    // At 5000 (at 2000 had its entry gone), Y's head is at 3000.
  EXPECT_EQ(p.Peek()->work.tenant, y);
}

TEST(SharePolicyTest, ATenantThatJoinsLateStartsAtTheVirtualTimeAndGetsItsShareAtOnce) {
  SharePolicy p;
  auto a = T(0, 1), b = T(1, 1);
  p.Add(Req(a, 1000));
  PopBacklogged(p, 1000, 1000);  // `a` alone for a while: that earns `b` nothing, nor costs it.
  p.Add(Req(b, 1000));
  std::map<int64_t, int> got = PopBacklogged(p, 20, 1000);
  EXPECT_EQ(got[0], 10);
  EXPECT_EQ(got[1], 10);
}

TEST(SharePolicyTest, AShareChangedLiveTakesEffectForTheNextRequests) {
  SharePolicy p;
  auto a = T(0, 1), b = T(1, 1);
  p.Add(Req(a, 1000));
  p.Add(Req(b, 1000));
  std::map<int64_t, int> before = PopBacklogged(p, 100, 1000);
  EXPECT_NEAR(before[0], 50, 1);
  b->set_share(3);
  std::map<int64_t, int> after = PopBacklogged(p, 400, 1000);
  EXPECT_NEAR(after[0], 100, 2);
  EXPECT_NEAR(after[1], 300, 2);
}

// Whatever the shares, each tenant's requests go in the order they came, and requests spanning
// islands go in submission order among themselves.
TEST(SharePolicyTest, KeepsEachTenantsOrderAndTheOrderOfRequestsSpanningIslands) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    SharePolicy p;
    std::vector<std::shared_ptr<Tenant>> tenants;
    for (int t = 0; t < 4; ++t) tenants.push_back(T(t, 1 + rng() % 8));
    std::map<int64_t, int64_t> last_of_tenant;
    int64_t last_spanning = -1;
    int64_t seq = 0;
    int queued = 0;
    for (int step = 0; step < 200; ++step) {
      if (queued == 0 || rng() % 3 != 0) {
        const auto& t = tenants[rng() % tenants.size()];
        p.Add(Req(t, 100 + rng() % 1000, seq, rng() % 4 == 0, seq));
        ++seq;
        ++queued;
        continue;
      }
      ASSERT_NE(p.Peek(), nullptr) << "a request was queued, but none may go";
      std::unique_ptr<ScheduleRequest> r = p.Pop();
      --queued;
      const int64_t tenant = r->work.tenant->id();
      if (last_of_tenant.contains(tenant)) {
        EXPECT_GT(r->work.seq, last_of_tenant[tenant]);
      }
      last_of_tenant[tenant] = r->work.seq;
      if (r->work.spans_islands) {
        EXPECT_GT(r->work.seq, last_spanning);
        last_spanning = r->work.seq;
      }
    }
  }
}

TEST(SharePolicyTest, CountsQueuedRequestsByTenant) {
  SharePolicy p;
  auto a = T(0, 1), b = T(1, 1);
  p.Add(Req(a, 1));
  p.Add(Req(a, 1));
  p.Add(Req(b, 1));
  EXPECT_EQ(p.size(), 3u);
  EXPECT_THAT(p.QueuedByTenant(),
              testing::UnorderedElementsAre(testing::Pair(0, 2), testing::Pair(1, 1)));
}

}  // namespace
}  // namespace pw
