// ShmMailbox: a multi-producer, single-consumer message ring in a POSIX shared-memory segment,
// for small messages between processes on one machine (native collectives' inputs, fetches of
// small shards and their answers, the controller's commands to a worker and their events:
// pw/server's PeerMail) at futex latency instead of an RPC.
//
// The owner creates the mailbox and runs one receiver thread that hands each message to a
// callback (threads of the owner waiting for a message may hand them on too: Poll); other
// processes open it by name and Send. Producers serialize on a spin lock in the
// segment; the receiver sleeps on a futex word (shared, not process-private). A message that
// does not fit is refused (the caller falls back to RPC). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pw/dataplane/shm_segment.h"

namespace pw::dataplane {

class ShmMailbox {
 public:
  using OnMessage = std::function<void(absl::string_view)>;
  static constexpr size_t kDefaultCapacity = size_t{4} << 20;

  // The owner's side: creates the segment and starts the receiver thread.
  static absl::StatusOr<std::unique_ptr<ShmMailbox>> Create(OnMessage on_message,
                                                            size_t capacity = kDefaultCapacity);
  // A producer's side.
  static absl::StatusOr<std::unique_ptr<ShmMailbox>> Open(const std::string& name);
  // The owner unlinks the segment and stops its thread.
  ~ShmMailbox();

  const std::string& name() const { return segment_->name(); }
  // A random number the owner's Create put in the header (as read at Open). Segments are
  // readable by their user only (0600), so a process that names a mailbox and gives its key
  // shows that it could open it: another user's process cannot have a mailbox it names opened
  // for it by a process of the mailbox's user.
  uint64_t key() const { return key_; }
  // Appends one message; ResourceExhausted if it does not fit now, or if the producers' lock
  // stays taken past `max_spins` tries (the caller uses another path). A mailbox whose owner is
  // not trusted (a client's) is given few.
  static constexpr int kDefaultMaxSpins = 100000;
  absl::Status Send(absl::string_view message, int max_spins = kDefaultMaxSpins);
  // The largest message Send ever takes (half the ring, less its length word).
  size_t max_message_bytes() const;

  // The owner's side: hands the messages waiting now to the callback on the calling thread, so
  // a thread waiting for one need not wait for the receiver thread to be scheduled. Returns
  // whether it handed on any; false at once while another thread is handing messages on (one
  // thread at a time does, in order), after StopDelivering, and on a producer's side.
  bool Poll();
  // As Poll, but first waits for a delivery in progress on another thread to end, so that every
  // message sent before the call has been handed on when it returns. Not from the callback.
  void Flush();
  // The owner's side: waits for a delivery in progress to end and stops the receiver thread;
  // from then on no message is handed to the callback (call it before destroying what the
  // callback uses). Producers can still Send.
  void StopDelivering();

 private:
  struct Header;
  ShmMailbox() = default;
  void ReceiveLoop();
  void StopReceiver();  // Ends and joins the receiver thread (the owner's side).
  // Hands on what is in the ring; the caller holds `delivering_`.
  bool Drain();

  std::shared_ptr<ShmSegment> segment_;  // Of kind kMailbox (shm_segment.h).
  bool owner_ = false;
  Header* header_ = nullptr;
  uint32_t capacity_ = 0;  // The ring's bytes, as checked when made or opened (not re-read).
  uint64_t key_ = 0;
  char* ring_ = nullptr;
  OnMessage on_message_;
  std::atomic<bool> delivering_{false};  // Held by the thread handing messages on.
  std::vector<char> message_;            // Its buffer.
  std::atomic<bool> stop_{false};
  std::thread receiver_;
};

}  // namespace pw::dataplane
