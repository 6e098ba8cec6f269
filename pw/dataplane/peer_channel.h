// PeerChannel: a reader's way to one peer worker's large shards, on the medium chosen once, when
// the peer joined (its machine in the host table): shared memory on this machine (a pool of
// reusable segments, shm_arena.h), else the peer's bulk stream (TCP, bulk_client.h).
//
// The control transport (pw/rpc's FetchShard stream) carries the request, which names the medium
// (and the pool segment offered), and the answer, which names a ShardLocation; the channel reads
// the bytes from there. Shards small enough for the stream's chunks never reach it.
//
// Thread-safe; one Fetch is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pw/dataplane/bulk_client.h"
#include "pw/dataplane/shm_arena.h"
#include "pw/dataplane/tls.h"

namespace pw::dataplane {

enum class Medium { kSharedMemory, kBulk };

// Where the serving worker put a shard's bytes.
struct InSharedMemory {
  std::string segment;     // A one-transfer segment; empty: the segment the reader offered.
  std::string dest_error;  // Why the offered segment could not be used, if it could not.
};
struct OnBulkStream {
  uint64_t ticket = 0;  // Nonzero.
  int port = 0;         // The bulk stream's port on the peer's host.
};
using ShardLocation = std::variant<InSharedMemory, OnBulkStream>;

class PeerChannel {
 public:
  // Shared memory; segments are unlinked when the channel closes or goes.
  static std::shared_ptr<PeerChannel> SharedMemory();
  // The bulk stream of the worker at `host` (HostOf form), saying `token`, over TLS if given.
  static std::shared_ptr<PeerChannel> Bulk(std::string host, std::string token,
                                           std::shared_ptr<const TlsContext> tls);
  ~PeerChannel();
  Medium medium() const { return medium_; }

  // One shard's fetch.
  class Fetch {
   public:
    ~Fetch();  // Returns a pool segment it holds.
    Fetch(const Fetch&) = delete;
    Fetch& operator=(const Fetch&) = delete;
    Medium medium() const { return channel_->medium_; }
    // Shared memory: the pool segment offered to the writer ("" when none is free).
    std::string offered() const;
    // Reads the shard at `where` into `dst` (`size` bytes, which stay valid until `done`). `done`
    // runs once: before Read returns for shared memory, on a reader thread for the bulk stream.
    // A location this fetch cannot take (another medium's, a second one, a bad ticket, a
    // segment too small) is DataLoss.
    void Read(const ShardLocation& where, void* dst, size_t size,
              absl::AnyInvocable<void(const absl::Status&)> done);
    // Instead of Read, for shared memory: where the writer put the shard in the pool segment this
    // fetch offered, and the shard fills more than half of it, hands the segment over as the
    // shard's memory (one copy per transfer, the writer's, instead of two). The segment stays out
    // of the pool until the returned memory's last holder lets it go. nullptr where it cannot:
    // Read then copies (another location, a segment of its own, a second read, a shard far
    // smaller than the segment, which would hold the segment's bytes for a small shard's life).
    std::shared_ptr<void> Adopt(const ShardLocation& where, size_t size);
    // The fetch ended with all `size` bytes: a shard that needed a fresh segment grows the pool,
    // so that the next one of its size finds a segment free.
    void Succeeded(size_t size);

   private:
    friend class PeerChannel;
    explicit Fetch(std::shared_ptr<PeerChannel> channel);
    absl::Status ReadSharedMemory(const InSharedMemory& where, void* dst, size_t size);
    const std::shared_ptr<PeerChannel> channel_;
    std::shared_ptr<ShmSegment> segment_;  // Taken from the pool for this fetch, if any.
    bool read_ = false;
    bool used_fresh_segment_ = false;
    bool writer_cannot_open_ = false;
  };
  static std::unique_ptr<Fetch> Begin(std::shared_ptr<PeerChannel> channel);

  // The peer is gone: the pool's free segments go now, those in use as their fetches end.
  void Close();

 private:
  explicit PeerChannel(Medium medium) : medium_(medium) {}
  const Medium medium_;
  std::shared_ptr<ShmArena> arena_;   // Shared memory.
  std::shared_ptr<BulkClient> bulk_;  // The bulk stream.
};

// The serving side of shared memory: copies `size` bytes of `data` into the reader's `offered`
// segment, or (none offered, or unusable) into a fresh one-transfer segment, and says which.
absl::StatusOr<InSharedMemory> PlaceInSharedMemory(ShmWriterCache& writer,
                                                   const std::string& offered, const void* data,
                                                   size_t size);

}  // namespace pw::dataplane
