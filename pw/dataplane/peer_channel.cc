#include "pw/dataplane/peer_channel.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pw/dataplane/shm_segment.h"

namespace pw::dataplane {

std::shared_ptr<PeerChannel> PeerChannel::SharedMemory() {
  std::shared_ptr<PeerChannel> c(new PeerChannel(Medium::kSharedMemory));
  c->arena_ = std::make_shared<ShmArena>();
  return c;
}

std::shared_ptr<PeerChannel> PeerChannel::Bulk(std::string host, std::string token,
                                               std::shared_ptr<const TlsContext> tls) {
  std::shared_ptr<PeerChannel> c(new PeerChannel(Medium::kBulk));
  c->bulk_ = std::make_shared<BulkClient>(std::move(host), std::move(token), std::move(tls));
  return c;
}

PeerChannel::~PeerChannel() = default;

void PeerChannel::Close() {
  if (arena_ != nullptr) arena_->Close();
}

std::unique_ptr<PeerChannel::Fetch> PeerChannel::Begin(std::shared_ptr<PeerChannel> channel) {
  return std::unique_ptr<Fetch>(new Fetch(std::move(channel)));
}

PeerChannel::Fetch::Fetch(std::shared_ptr<PeerChannel> channel) : channel_(std::move(channel)) {
  if (channel_->arena_ != nullptr) segment_ = channel_->arena_->Take();
}

PeerChannel::Fetch::~Fetch() {
  if (segment_ != nullptr) channel_->arena_->Give(std::move(segment_));
}

std::string PeerChannel::Fetch::offered() const {
  return segment_ == nullptr ? std::string() : segment_->name();
}

void PeerChannel::Fetch::Read(const ShardLocation& where, void* dst, size_t size,
                              absl::AnyInvocable<void(const absl::Status&)> done) {
  const auto* shm = std::get_if<InSharedMemory>(&where);
  absl::Status refused;
  if (read_) {
    refused = absl::DataLossError("shard stream: a second location");
  } else if (shm != nullptr && channel_->arena_ == nullptr) {
    refused = absl::DataLossError("shard stream: shared memory that this reader did not ask for");
  }
  if (!refused.ok()) {
    if (shm != nullptr) UnlinkSharedMemory(shm->segment);  // Its writer let it go.
    return done(refused);
  }
  read_ = true;
  if (shm != nullptr) return done(ReadSharedMemory(*shm, dst, size));
  const OnBulkStream& bulk = std::get<OnBulkStream>(where);
  if (channel_->bulk_ == nullptr)
    return done(
        absl::DataLossError("shard stream: a bulk ticket that this reader did not ask for"));
  if (bulk.ticket == 0 || bulk.port <= 0 || bulk.port > 65535)
    return done(absl::DataLossError(
        absl::StrCat("shard stream: bulk ticket ", bulk.ticket, " on port ", bulk.port)));
  channel_->bulk_->Read(bulk.port, bulk.ticket, dst, size, std::move(done));
}

std::shared_ptr<void> PeerChannel::Fetch::Adopt(const ShardLocation& where, size_t size) {
  const auto* shm = std::get_if<InSharedMemory>(&where);
  if (read_ || shm == nullptr || !shm->segment.empty() || segment_ == nullptr || size == 0 ||
      segment_->capacity() < size || segment_->capacity() / 2 >= size) {
    return nullptr;
  }
  read_ = true;
  // Back to the pool (or unlinked, if the peer has gone) when the shard's last holder lets go.
  ShmSegment* const segment = segment_.get();
  std::shared_ptr<ShmSegment> lease(
      segment, [arena = channel_->arena_, held = std::move(segment_)](ShmSegment*) mutable {
        arena->Give(std::move(held));
      });
  return std::shared_ptr<void>(std::move(lease), segment->data());
}

absl::Status PeerChannel::Fetch::ReadSharedMemory(const InSharedMemory& where, void* dst,
                                                  size_t size) {
  ShmArena& arena = *channel_->arena_;
  if (where.segment.empty()) {
    if (segment_ == nullptr || segment_->capacity() < size)
      return absl::DataLossError(
          "shard stream: the shard is said to be in a segment it cannot be in");
    if (size > 0) std::memcpy(dst, segment_->data(), size);
    return absl::OkStatus();
  }
  if (!where.dest_error.empty() && segment_ != nullptr) {
    // The writer could not use our segment (gone from its view, or too small): a too-small one
    // goes back to the pool; one it cannot open is dropped.
    if (segment_->capacity() >= size) {
      arena.Discard(segment_);
      writer_cannot_open_ = true;  // Growing the pool would not help this reader.
    } else {
      arena.Give(segment_);
    }
    segment_ = nullptr;
  }
  used_fresh_segment_ = true;
  return dataplane::ReadSharedMemory(where.segment, dst, size);
}

void PeerChannel::Fetch::Succeeded(size_t size) {
  if (used_fresh_segment_ && !writer_cannot_open_) channel_->arena_->Grow(size).IgnoreError();
}

absl::StatusOr<InSharedMemory> PlaceInSharedMemory(ShmWriterCache& writer,
                                                   const std::string& offered, const void* data,
                                                   size_t size) {
  InSharedMemory where;
  if (!offered.empty()) {
    const absl::Status in_offered = writer.Write(offered, data, size);
    if (in_offered.ok()) return where;
    where.dest_error = in_offered.ToString();
  }
  absl::StatusOr<std::string> name = WriteSharedMemory(data, size);
  if (!name.ok()) return name.status();
  where.segment = *std::move(name);
  return where;
}

}  // namespace pw::dataplane
