// POSIX shared-memory segments for the data plane between workers on one machine: the serving
// worker copies a shard into a fresh segment and names it; the reader maps it, copies it out and
// unlinks it. One copy on each side, no socket.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace pw::rpc {

// Creates a segment holding `size` bytes of `data`; returns its name.
absl::StatusOr<std::string> WriteSharedMemory(const void* data, size_t size);
// Removes a segment this process wrote that no reader will take.
void UnlinkSharedMemory(const std::string& name);
// Copies exactly `size` bytes of segment `name` into `dst`, then unlinks it (also on error).
absl::Status ReadSharedMemory(const std::string& name, void* dst, size_t size);

}  // namespace pw::rpc
