#include "pw/object_store/object_store.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pw/object_store/buffer_table.h"

namespace pw {
namespace {

// TryCharge with a client quota only (and a tenant's): whether it charged.
bool Charge(BufferTable& t, ClientId c, int64_t bytes, int64_t quota, int64_t tenant = -1,
            int64_t tenant_quota = 0) {
  return t.TryCharge(c, bytes, {quota, tenant, tenant_quota}) == BufferTable::Over::kNothing;
}


TEST(ObjectStoreTest, PutGetDeleteReleasesMemory) {
  DeviceMemory mem(DeviceId(0), 100);
  ObjectStore store;
  Promise<DeviceBufferRef> p;
  ASSERT_TRUE(store.Put(BufferId(1), DeviceId(0), {p.future(), mem.Reserve(40), 40}).ok());
  EXPECT_EQ(store.Put(BufferId(1), DeviceId(0), {p.future(), mem.Reserve(1), 1}).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(mem.in_use(), 40);  // The refused duplicate and its reservation were dropped.
  auto got = store.Get(BufferId(1), DeviceId(0));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(store.Ready(BufferId(1)).IsReady());
  p.Set(DeviceBufferRef(HostDeviceBuffer::Create({DType::kF32, Shape({10})}, DeviceId(0))));
  EXPECT_TRUE(store.Ready(BufferId(1)).status().ok());
  EXPECT_EQ(store.bytes(), 40);
  EXPECT_EQ(store.Get(BufferId(2), DeviceId(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get(BufferId(1), DeviceId(9)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Delete(BufferId(1)), 1);
  EXPECT_EQ(store.num_buffers(), 0u);
  EXPECT_EQ(store.bytes(), 0);
}

TEST(BufferTableTest, RefcountPerLogicalBuffer) {
  BufferTable t;
  ClientId a(1), b(2);
  LogicalBuffer lb;
  lb.owner = a;
  BufferId id = t.Create(lb, /*client_refs=*/1, /*pins=*/1);
  EXPECT_TRUE(t.Lookup(a, id).ok());
  EXPECT_EQ(t.Lookup(b, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.ReleaseHandle(b, id).status().code(), absl::StatusCode::kNotFound);
  auto freed = t.ReleaseHandle(a, id);
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->empty());  // Still pinned by a run.
  EXPECT_EQ(t.ReleaseHandle(a, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Lookup(a, id).status().code(), absl::StatusCode::kNotFound);
  auto f2 = t.Unpin({id});
  ASSERT_EQ(f2.size(), 1u);
  EXPECT_EQ(f2[0].id, id);
  EXPECT_EQ(t.size(), 0u);
}

TEST(BufferTableTest, BuffersWithAShardOnAFailedHostAreLostAndStillReleased) {
  BufferTable t;
  ClientId a(1);
  auto placed = [](std::vector<int> hosts) {
    auto p = std::make_shared<Placement>();
    for (int h : hosts) p->hosts.push_back(HostId(h));
    return LogicalBuffer{BufferId(), ClientId(1), p, Future<>::Ready(absl::OkStatus())};
  };
  const BufferId on_both = t.Create(placed({0, 1}), 1, 0);
  const BufferId on_zero = t.Create(placed({0, 0}), 1, 0);
  EXPECT_EQ(t.LoseHost(HostId(1), absl::UnavailableError("host:1 failed: killed")), 1);
  const absl::Status lost = t.LookupAndPin(a, on_both).status();
  EXPECT_EQ(lost.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(lost.message(), absl::StrCat(on_both.ToString(), " was lost: host:1 failed: killed"));
  EXPECT_EQ(t.Lookup(a, on_both).status(), lost);
  EXPECT_TRUE(t.LookupAndPin(a, on_zero).ok());
  EXPECT_EQ(t.LoseHost(HostId(1), absl::UnavailableError("again")), 0);  // Lost once.
  auto freed = t.ReleaseHandle(a, on_both);
  ASSERT_TRUE(freed.ok()) << freed.status();
  ASSERT_EQ(freed->size(), 1u);  // Its handle frees it (its hosts delete what is left).
  EXPECT_EQ(t.size(), 1u);
}

TEST(BufferTableTest, ReleaseClientFreesUnpinned) {
  BufferTable t;
  LogicalBuffer lb;
  lb.owner = ClientId(1);
  t.Create(lb, 1, 0);
  BufferId pinned = t.Create(lb, 1, 1);
  lb.owner = ClientId(2);
  t.Create(lb, 1, 0);
  EXPECT_EQ(t.ReleaseClient(ClientId(1)).size(), 1u);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.Unpin({pinned}).size(), 1u);
}

TEST(BufferTableTest, ASharedBufferLivesWhileAnyClientHoldsItAndIsChargedToItsOwner) {
  BufferTable t;
  ClientId owner(1), reader(2), other(3);
  ASSERT_TRUE(Charge(t, owner, 64, 0));
  LogicalBuffer lb;
  lb.owner = owner;
  BufferId id = t.Create(lb, /*client_refs=*/1, /*pins=*/0, /*charged=*/64);
  ASSERT_TRUE(t.AddHandle(reader, id).ok());
  EXPECT_TRUE(t.Lookup(reader, id).ok());
  EXPECT_TRUE(t.LookupAndPin(reader, id).ok());  // A run of the reader's reads it.
  EXPECT_EQ(t.Lookup(other, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(t.ReleaseClient(owner).empty()) << "the reader still holds it";
  EXPECT_EQ(t.Lookup(owner, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.HeldBytes(owner), 64);
  EXPECT_TRUE(t.DropHandles(reader, id).empty()) << "the reader's run still pins it";
  EXPECT_EQ(t.Lookup(reader, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Unpin({id}).size(), 1u);
  EXPECT_EQ(t.HeldBytes(owner), 0);
  absl::StatusOr<LogicalBuffer> gone = t.AddHandle(other, id);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("is gone"), std::string::npos) << gone.status();
  // Two handles of one client are released one at a time.
  BufferId twice = t.Create(lb, 1, 0);
  ASSERT_TRUE(t.AddHandle(reader, twice).ok());
  ASSERT_TRUE(t.AddHandle(reader, twice).ok());
  EXPECT_TRUE(t.ReleaseHandle(owner, twice)->empty());
  EXPECT_TRUE(t.ReleaseHandle(reader, twice)->empty());
  EXPECT_EQ(t.ReleaseHandle(reader, twice)->size(), 1u);
}

TEST(BufferTableTest, ChargesEachClientWithinItsQuotaUntilItsBuffersAreFreed) {
  BufferTable t;
  LogicalBuffer lb;
  lb.owner = ClientId(1);
  ASSERT_TRUE(Charge(t, ClientId(1), 60, /*quota=*/100));
  const BufferId a = t.Create(lb, /*client_refs=*/1, /*pins=*/0, /*charged=*/60);
  EXPECT_FALSE(Charge(t, ClientId(1), 41, 100));  // 101 > 100: nothing charged.
  EXPECT_EQ(t.HeldBytes(ClientId(1)), 60);
  EXPECT_TRUE(Charge(t, ClientId(2), 100, 100));  // Another client's quota is its own.
  EXPECT_FALSE(Charge(t, ClientId(3), int64_t{1} << 62, 100));  // No overflow past the quota.
  ASSERT_TRUE(Charge(t, ClientId(1), 40, 100));
  const BufferId b = t.Create(lb, 1, /*pins=*/1, 40);
  ASSERT_TRUE(t.ReleaseHandle(ClientId(1), a).ok());
  EXPECT_EQ(t.HeldBytes(ClientId(1)), 40);
  EXPECT_TRUE(t.ReleaseClient(ClientId(1)).empty());  // b is still pinned by a run: still held.
  EXPECT_EQ(t.HeldBytes(ClientId(1)), 40);
  EXPECT_EQ(t.Unpin({b}).size(), 1u);
  EXPECT_EQ(t.HeldBytes(ClientId(1)), 0);
  EXPECT_TRUE(Charge(t, ClientId(1), 100, 100));
  EXPECT_TRUE(Charge(t, ClientId(4), int64_t{1} << 62, /*quota=*/0));  // 0: no quota.
}

// Issue 24: a tenant's clients share its quota; each still has its own.
TEST(BufferTableTest, ATenantsClientsShareItsQuota) {
  BufferTable t;
  LogicalBuffer lb;
  lb.owner = ClientId(1);
  EXPECT_EQ(t.TryCharge(ClientId(1), 60, {0, /*tenant=*/7, /*tenant_bytes=*/100}),
            BufferTable::Over::kNothing);
  const BufferId a = t.Create(lb, 1, 0, 60);
  // Client 2 of the same tenant: 60 + 50 > 100, though it holds nothing itself.
  EXPECT_EQ(t.TryCharge(ClientId(2), 50, {0, 7, 100}), BufferTable::Over::kTenantQuota);
  EXPECT_EQ(t.TryCharge(ClientId(2), 50, {40, 7, 100}), BufferTable::Over::kClientQuota);
  EXPECT_EQ(t.TryCharge(ClientId(3), 50, {0, 8, 100}), BufferTable::Over::kNothing);  // Another.
  EXPECT_EQ(t.TenantHeldBytes(7), 60);
  EXPECT_EQ(t.ReleaseHandle(ClientId(1), a)->size(), 1u);  // Freed: the tenant's bytes back.
  EXPECT_EQ(t.TenantHeldBytes(7), 0);
  EXPECT_EQ(t.TryCharge(ClientId(2), 100, {0, 7, 100}), BufferTable::Over::kNothing);
}

TEST(BufferTableTest, UnlistedIdsAreNeverReusedAndNotEntries) {
  BufferTable t;
  LogicalBuffer lb;
  lb.owner = ClientId(1);
  const BufferId a = t.Create(lb, 1, 0);
  const BufferId first = t.NewIds(3);
  const BufferId b = t.Create(lb, 1, 0);
  EXPECT_EQ(first.value(), a.value() + 1);
  EXPECT_EQ(b.value(), first.value() + 3);  // After the three unlisted ids.
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.Lookup(ClientId(1), first).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pw

namespace pw {
namespace {

TEST(ObjectStoreTest, PeersWaitForShardsNotCreatedYet) {
  DeviceMemory mem(DeviceId(0), 100);
  ObjectStore store;
  Future<DeviceBufferRef> early = store.GetWhenCreated(BufferId(4), DeviceId(0));
  Future<DeviceBufferRef> orphan = store.GetWhenCreated(BufferId(5), DeviceId(0));
  EXPECT_FALSE(early.IsReady());
  Promise<DeviceBufferRef> p;
  ASSERT_TRUE(store.Put(BufferId(4), DeviceId(0), {p.future(), mem.Reserve(4), 4}).ok());
  EXPECT_FALSE(early.IsReady());  // Created, not yet computed.
  p.Set(DeviceBufferRef(HostDeviceBuffer::Create({DType::kF32, Shape({1})}, DeviceId(0))));
  ASSERT_TRUE(early.IsReady());
  EXPECT_TRUE(early.status().ok());
  store.Delete(BufferId(5));
  ASSERT_TRUE(orphan.IsReady());
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kNotFound);
}

TEST(ObjectStoreTest, AClosedStoreDropsEverythingFailsItsWaitersAndHoldsNothingMore) {
  DeviceMemory mem(DeviceId(0), 100);
  ObjectStore store;
  Promise<DeviceBufferRef> p;
  ASSERT_TRUE(store.Put(BufferId(1), DeviceId(0), {p.future(), mem.Reserve(40), 40}).ok());
  Future<DeviceBufferRef> waiting = store.GetWhenCreated(BufferId(2), DeviceId(0));
  const absl::Status dead = absl::UnavailableError("host:3 failed: killed");
  store.Close(dead);
  EXPECT_EQ(mem.in_use(), 0);  // Its shards' memory is released.
  EXPECT_EQ(store.num_buffers(), 0u);
  EXPECT_EQ(store.bytes(), 0);
  ASSERT_TRUE(waiting.IsReady());
  EXPECT_EQ(waiting.status(), dead);
  EXPECT_EQ(store.Get(BufferId(1), DeviceId(0)).status(), dead);
  Future<DeviceBufferRef> late = store.GetWhenCreated(BufferId(3), DeviceId(0));
  ASSERT_TRUE(late.IsReady());
  EXPECT_EQ(late.status(), dead);
  EXPECT_EQ(store.Put(BufferId(3), DeviceId(0), {p.future(), mem.Reserve(1), 1}), dead);
  EXPECT_EQ(mem.in_use(), 0);
}

}  // namespace
}  // namespace pw
