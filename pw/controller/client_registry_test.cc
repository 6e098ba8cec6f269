#include "pw/controller/client_registry.h"

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

using ::testing::HasSubstr;

TEST(ClientRegistryTest, ClientsJoinTenantsWithSharesAndEachOtherwiseIsItsOwn) {
  ClientRegistry r;
  ClientId a = *r.Connect("trainer", {.tenant = "train", .share = 4});
  ClientId b = *r.Connect("trainer", {.tenant = "train"});
  ClientId c = *r.Connect("lonely", {});
  ClientId d = *r.Connect("lonely", {});
  EXPECT_EQ(r.Enter(a)->tenant(), r.Enter(b)->tenant());
  EXPECT_EQ(r.Enter(a)->tenant()->share(), 4);
  // Clients without a tenant each get one of their own, even with the same name.
  EXPECT_NE(r.Enter(c)->tenant(), r.Enter(d)->tenant());
  EXPECT_EQ(r.Enter(c)->tenant()->share(), 1);
  EXPECT_THAT(r.Enter(c)->tenant()->name(), HasSubstr("lonely:"));
  EXPECT_EQ(r.Tenants().size(), 3u);
  // A tenant goes with its last client.
  ASSERT_TRUE(r.Disconnect(a).ok());
  EXPECT_EQ(r.Tenants().size(), 3u);
  ASSERT_TRUE(r.Disconnect(b).ok());
  EXPECT_EQ(r.Tenants().size(), 2u);
  EXPECT_TRUE(absl::IsUnauthenticated(r.Enter(a).status()));
  EXPECT_TRUE(absl::IsUnauthenticated(r.Disconnect(a)));
}

// A client's own tenant is its alone: another client cannot name it (joining it and setting its
// share), nor take its name before it connects. An admin still can set it.
TEST(ClientRegistryTest, NoClientJoinsAnotherClientsOwnTenant) {
  ClientRegistry r;
  ClientId alice = *r.Connect("alice", {});
  const std::string own = r.Enter(alice)->tenant()->name();
  ASSERT_THAT(own, HasSubstr("alice:"));
  absl::StatusOr<ClientId> joined = r.Connect("mallory", {.tenant = own, .share = 0.001});
  EXPECT_TRUE(absl::IsInvalidArgument(joined.status())) << joined.status();
  EXPECT_THAT(joined.status().message(), HasSubstr("kept for clients' own tenants"));
  EXPECT_EQ(r.Enter(alice)->tenant()->share(), 1);
  // The next client's own name, taken first: refused too, so "bob" gets a tenant of its own.
  EXPECT_TRUE(absl::IsInvalidArgument(r.Connect("mallory", {.tenant = "bob:1"}).status()));
  ClientId bob = *r.Connect("bob", {});
  EXPECT_EQ(r.Enter(bob)->tenant()->share(), 1);
  EXPECT_EQ(r.Tenants().size(), 2u);
  EXPECT_TRUE(r.SetTenant({.name = own, .share = 2}).ok());
  EXPECT_EQ(r.Enter(alice)->tenant()->share(), 2);
}

// A client disconnecting while calls of it are in progress: refused from then on, and its
// cleanup runs once, when the last call ends (on that call's thread), then it is forgotten.
TEST(ClientRegistryTest, ACleanupWaitsForTheClientsCallsInProgress) {
  ClientRegistry r;
  ClientId a = *r.Connect("a", {});
  int cleanups = 0;
  {
    auto first = r.Enter(a);
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(first->tenant()->name(), "a:0");
    std::optional<ClientRegistry::Visit> second(*std::move(r.Enter(a)));
    ASSERT_TRUE(r.Disconnect(a, [&] { ++cleanups; }).ok());
    EXPECT_THAT(std::string(r.Enter(a).status().message()), HasSubstr("is not connected"));
    EXPECT_TRUE(absl::IsUnauthenticated(r.QuotaOf(a).status()));
    EXPECT_TRUE(absl::IsUnauthenticated(r.Disconnect(a)));  // Once.
    ClientRegistry::Visit moved(*std::move(first));  // Still one visit.
    second.reset();
    EXPECT_EQ(cleanups, 0);
    EXPECT_EQ(r.size(), 1u);
  }
  EXPECT_EQ(cleanups, 1);
  EXPECT_EQ(r.size(), 0u);
  EXPECT_TRUE(r.Tenants().empty());
  // With no call in progress it runs at once.
  ClientId b = *r.Connect("b", {});
  ASSERT_TRUE(r.Disconnect(b, [&] { ++cleanups; }).ok());
  EXPECT_EQ(cleanups, 2);
  EXPECT_EQ(r.size(), 0u);
}

// Calls coming and going on other threads while the client disconnects: none sees its cleanup,
// which runs exactly once, after the last of them.
TEST(ClientRegistryTest, ACleanupRunsOnceAfterCallsOnOtherThreads) {
  for (int round = 0; round < 100; ++round) {
    ClientRegistry r;
    ClientId a = *r.Connect("a", {});
    std::atomic<int> cleanups{0}, in_calls{0};
    std::vector<std::thread> calls;
    for (int t = 0; t < 4; ++t) {
      calls.emplace_back([&] {
        for (int i = 0; i < 100; ++i) {
          auto visit = r.Enter(a);
          if (!visit.ok()) return;
          in_calls.fetch_add(1);
          EXPECT_EQ(cleanups.load(), 0);
          in_calls.fetch_sub(1);
        }
      });
    }
    ASSERT_TRUE(r.Disconnect(a, [&] {
                   EXPECT_EQ(in_calls.load(), 0);
                   cleanups.fetch_add(1);
                 }).ok());
    for (std::thread& t : calls) t.join();
    EXPECT_EQ(cleanups.load(), 1);
    EXPECT_EQ(r.size(), 0u);
  }
}

TEST(ClientRegistryTest, AnAdminsSettingsPinATenantAndWinOverClients) {
  ClientRegistry r;
  ASSERT_TRUE(r.SetTenant({.name = "serve", .share = 2, .memory_bytes = 1 << 20}).ok());
  ClientId a = *r.Connect("server", {.tenant = "serve", .share = 100});
  EXPECT_EQ(r.Enter(a)->tenant()->share(), 2);  // The admin's, not the client's.
  ClientRegistry::Quota q = *r.QuotaOf(a);
  EXPECT_EQ(q.bytes, 1 << 20);
  EXPECT_EQ(q.name, "serve");
  ASSERT_TRUE(r.Disconnect(a).ok());
  ASSERT_EQ(r.Tenants().size(), 1u);  // Pinned: kept without clients.
  EXPECT_TRUE(r.Tenants()[0].pinned);
  ASSERT_TRUE(r.SetTenant({.name = "serve", .share = 8}).ok());  // Live; the quota stays.
  EXPECT_EQ(r.Tenants()[0].tenant->share(), 8);
  EXPECT_EQ(r.Tenants()[0].memory_quota, 1 << 20);
}

TEST(ClientRegistryTest, BadNamesAndSharesAreRefusedNamingThem) {
  ClientRegistry r;
  absl::StatusOr<ClientId> bad = r.Connect("c", {.tenant = "no spaces"});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("'no spaces'"));
  EXPECT_TRUE(absl::IsInvalidArgument(r.Connect("c", {.tenant = std::string(200, 'x')}).status()));
  absl::StatusOr<ClientId> greedy = r.Connect("c", {.tenant = "t", .share = 1e9});
  EXPECT_TRUE(absl::IsInvalidArgument(greedy.status()));
  EXPECT_THAT(greedy.status().message(), HasSubstr("share 1e+09"));
  EXPECT_TRUE(absl::IsInvalidArgument(r.Connect("c", {.tenant = "t", .share = -1}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(r.SetTenant({.name = "t", .share = 0.0})));
  EXPECT_TRUE(absl::IsInvalidArgument(r.SetTenant({.name = "t", .memory_bytes = -5})));
  EXPECT_EQ(r.size(), 0u);
  EXPECT_TRUE(r.Tenants().empty());
}

TEST(ClientRegistryTest, AClientsRunsAreHandedOverInOrderBehindOneThatWaits) {
  ClientRegistry r;
  ClientId a = *r.Connect("a", {});
  ClientId b = *r.Connect("b", {});
  // Nothing waits: go now.
  ClientRegistry::HandOff now = r.Queue(a, Future<>::Ready(absl::OkStatus()));
  EXPECT_TRUE(now.go.IsReady());
  EXPECT_FALSE(now.handed.has_value());
  // A run waiting for another client's array, then one that does not wait itself.
  Promise<> input;
  ClientRegistry::HandOff first = r.Queue(a, input.future());
  ClientRegistry::HandOff second = r.Queue(a, Future<>::Ready(absl::OkStatus()));
  EXPECT_FALSE(first.go.IsReady());
  EXPECT_FALSE(second.go.IsReady());  // Behind the first.
  EXPECT_TRUE(r.Queue(b, Future<>::Ready(absl::OkStatus())).go.IsReady());  // Others do not wait.
  input.Set();
  ASSERT_TRUE(first.go.IsReady());
  EXPECT_FALSE(second.go.IsReady());  // Until the first has been handed over.
  first.handed->Set();
  EXPECT_TRUE(second.go.IsReady());
  second.handed->Set();
  EXPECT_FALSE(r.Queue(a, Future<>::Ready(absl::OkStatus())).handed.has_value());
}

}  // namespace
}  // namespace pw
