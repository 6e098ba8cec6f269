// ShmMailbox: a multi-producer, single-consumer message ring in a POSIX shared-memory segment,
// for small messages between worker processes on one machine (native collectives' inputs) at
// futex latency instead of an RPC round trip.
//
// The owner creates the mailbox and runs one receiver thread that hands each message to a
// callback; other processes open it by name and Send. Producers serialize on a spin lock in the
// segment; the receiver sleeps on a futex word (shared, not process-private). A message that
// does not fit is refused (the caller falls back to RPC). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pw::rpc {

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

  const std::string& name() const { return name_; }
  // Appends one message; ResourceExhausted if it does not fit now (the caller uses another path).
  absl::Status Send(absl::string_view message);

 private:
  struct Header;
  ShmMailbox() = default;
  void ReceiveLoop();

  std::string name_;
  bool owner_ = false;
  Header* header_ = nullptr;
  char* ring_ = nullptr;
  size_t mapped_ = 0;
  OnMessage on_message_;
  std::atomic<bool> stop_{false};
  std::thread receiver_;
};

}  // namespace pw::rpc
