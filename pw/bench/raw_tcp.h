// RawTcp: the baseline for the data plane's benchmarks — one loopback TCP connection whose far
// end (a thread of this process) reads exactly what is sent into one buffer of its size (reused
// from one message to the next) and acknowledges it.
//
// Not thread-safe: one caller at a time.
#pragma once

#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace pw {

class RawTcp {
 public:
  RawTcp() = default;
  RawTcp(const RawTcp&) = delete;
  RawTcp& operator=(const RawTcp&) = delete;
  ~RawTcp();
  absl::Status Open();
  // Sends `data` and waits for the far end to have read all of it.
  absl::Status Send(const std::vector<char>& data);

 private:
  int fd_ = -1;
  std::thread sink_;
};

}  // namespace pw
