#include "pw/rpc/client_io.h"

#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pw/base/future.h"
#include "pw/base/status_macros.h"
#include "pw/rpc/auth.h"

namespace pw::rpc {
namespace {

Box WholeOf(const Shape& shape) {
  return Box{std::vector<int64_t>(shape.rank(), 0),
             std::vector<int64_t>(shape.dims().begin(), shape.dims().end())};
}

// Where `box` starts in the row-major bytes of `whole`, when its bytes are one contiguous run
// there (a split of the leading dimension, say).
std::optional<int64_t> ContiguousOffset(const Box& box, const Box& whole, int64_t esize) {
  const size_t rank = whole.limit.size();
  size_t k = 0;  // Dimensions before k have extent 1; from k + 1 on they are whole.
  while (k < rank && box.limit[k] - box.start[k] == 1 && whole.limit[k] != 1) ++k;
  for (size_t d = k + 1; d < rank; ++d)
    if (box.start[d] != 0 || box.limit[d] != whole.limit[d]) return std::nullopt;
  int64_t offset = 0;
  for (size_t d = 0; d < rank; ++d) offset = offset * whole.limit[d] + box.start[d];
  return offset * esize;
}

// Where a transfer's error happened.
std::string Where(const ShardTransfer& t) {
  return absl::StrCat("the shard of rank ", t.rank, " at ", t.address);
}

}  // namespace

absl::StatusOr<std::pair<std::shared_ptr<dataplane::BulkClient>, int>> ClientIo::To(
    const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("client I/O: '", address, "' is not a worker's host:port"));
  const std::string host = HostOf(address);
  pw::MutexLock lock(&mu_);
  std::shared_ptr<dataplane::BulkClient>& c = clients_[host];
  // Clients say each transfer's key, never a token.
  if (c == nullptr) c = std::make_shared<dataplane::BulkClient>(host, "");
  return std::make_pair(c, port);
}

absl::Status ClientIo::Send(const ArraySpec& g, const uint8_t* bytes, const Sharding& sharding,
                            const std::vector<ShardTransfer>& shards) {
  const Box whole = WholeOf(g.shape);
  const size_t shard_bytes =
      static_cast<size_t>(ArraySpec{g.dtype, sharding.ShardShape(g.shape)}.size_bytes());
  // One cut per distinct region (replicas share it); a contiguous region is sent from `bytes`
  // itself.
  std::vector<std::pair<Box, std::shared_ptr<std::vector<uint8_t>>>> cuts;
  std::vector<Future<>> sent;
  absl::Status result;  // The first error; transfers already queued are still waited for.
  for (const ShardTransfer& t : shards) {
    if (t.rank < 0 || t.rank >= sharding.num_devices()) {
      result = absl::InvalidArgumentError(
          absl::StrCat("client I/O: a transfer for rank ", t.rank, " of ", sharding.ToString()));
      break;
    }
    const Box box = sharding.ShardBox(g.shape, t.rank);
    const std::optional<int64_t> at = ContiguousOffset(box, whole, DTypeSize(g.dtype));
    const void* src = bytes + at.value_or(0);
    std::shared_ptr<std::vector<uint8_t>> cut;
    if (!at.has_value()) {
      for (const auto& [b, c] : cuts)
        if (b == box) cut = c;
      if (cut == nullptr) {
        cut = std::make_shared<std::vector<uint8_t>>(shard_bytes);
        CopyBoxIntersection(bytes, whole, cut->data(), box, DTypeSize(g.dtype));
        cuts.emplace_back(box, cut);
      }
      src = cut->data();
    }
    auto to = To(t.address);
    if (!to.ok()) {
      result = to.status();
      break;
    }
    Promise<> p;
    sent.push_back(p.future());
    to->first->WriteTransfer(
        to->second, t.key, src, shard_bytes,
        [p = std::move(p), cut, where = Where(t)](const absl::Status& s) mutable {
          p.Set(s.ok() ? s : Annotate(s, where));
        });
  }
  for (Future<>& f : sent) result.Update(f.Await());  // Every transfer ends before `bytes` may go.
  return result;
}

void ClientIo::Read(const ArraySpec& spec, const Sharding& sharding,
                    std::vector<ShardTransfer> shards,
                    absl::AnyInvocable<void(absl::StatusOr<HostArray>)> done) {
  struct Assembly {
    ArraySpec spec;
    Sharding sharding;
    HostArray out;
    std::atomic<int> left{0};
    pw::Mutex mu;
    absl::Status status ABSL_GUARDED_BY(mu);
    absl::AnyInvocable<void(absl::StatusOr<HostArray>)> done;
    void Finish() {
      absl::Status s;
      {
        pw::MutexLock lock(&mu);
        s = status;
      }
      if (!s.ok()) return done(s);
      done(std::move(out));
    }
  };
  auto a = std::make_shared<Assembly>();
  a->spec = spec;
  a->sharding = sharding;
  a->out = HostArray{spec, Bytes(spec.size_bytes())};
  a->done = std::move(done);
  a->left = static_cast<int>(shards.size()) + 1;  // +1: until every read is started.
  const Box whole = WholeOf(spec.shape);
  const size_t shard_bytes =
      static_cast<size_t>(ArraySpec{spec.dtype, sharding.ShardShape(spec.shape)}.size_bytes());
  auto fail = [a](const absl::Status& s) {
    pw::MutexLock lock(&a->mu);
    a->status.Update(s);
  };
  for (const ShardTransfer& t : shards) {
    absl::StatusOr<std::pair<std::shared_ptr<dataplane::BulkClient>, int>> to = To(t.address);
    if (to.ok() && (t.rank < 0 || t.rank >= sharding.num_devices()))
      to = absl::InvalidArgumentError(absl::StrCat("client I/O: a shard of rank ", t.rank));
    if (!to.ok()) {
      fail(to.status());
      if (--a->left == 0) a->Finish();
      continue;
    }
    const Box box = sharding.ShardBox(spec.shape, t.rank);
    if (const std::optional<int64_t> at = ContiguousOffset(box, whole, DTypeSize(spec.dtype));
        at.has_value()) {  // Straight into the array.
      to->first->ReadTransfer(to->second, t.key, a->out.bytes.data() + *at, shard_bytes,
                              [a, fail, where = Where(t)](const absl::Status& s) {
                                if (!s.ok()) fail(Annotate(s, where));
                                if (--a->left == 0) a->Finish();
                              });
      continue;
    }
    auto staged = std::make_shared<Bytes>(shard_bytes);
    to->first->ReadTransfer(
        to->second, t.key, staged->data(), shard_bytes,
        [a, fail, staged, box, whole, where = Where(t)](const absl::Status& s) {
          if (!s.ok()) {
            fail(Annotate(s, where));
          } else {
            // Regions are disjoint: readers write different bytes of `out`.
            CopyBoxIntersection(staged->data(), box, a->out.bytes.data(), whole,
                                DTypeSize(a->spec.dtype));
          }
          if (--a->left == 0) a->Finish();
        });
  }
  if (--a->left == 0) a->Finish();
}

}  // namespace pw::rpc
