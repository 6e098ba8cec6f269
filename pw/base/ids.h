// Strongly typed integer IDs. Pure: no dependencies beyond abseil hashing and strings.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {

template <typename Tag>
class Id {
 public:
  constexpr Id() = default;
  constexpr explicit Id(int64_t v) : value_(v) {}
  constexpr int64_t value() const { return value_; }
  constexpr bool valid() const { return value_ >= 0; }
  friend constexpr auto operator<=>(Id, Id) = default;
  template <typename H>
  friend H AbslHashValue(H h, Id id) {
    return H::combine(std::move(h), id.value_);
  }
  std::string ToString() const { return absl::StrCat(Tag::kPrefix, value_); }
  friend std::ostream& operator<<(std::ostream& os, Id id) { return os << id.ToString(); }

 private:
  int64_t value_ = -1;
};

struct IslandTag { static constexpr const char* kPrefix = "island:"; };
struct HostTag { static constexpr const char* kPrefix = "host:"; };
struct DeviceTag { static constexpr const char* kPrefix = "device:"; };
struct SliceTag { static constexpr const char* kPrefix = "slice:"; };
struct ClientTag { static constexpr const char* kPrefix = "client:"; };
struct BufferTag { static constexpr const char* kPrefix = "buffer:"; };
struct FunctionTag { static constexpr const char* kPrefix = "function:"; };
struct ProgramTag { static constexpr const char* kPrefix = "program:"; };
struct RunTag { static constexpr const char* kPrefix = "run:"; };

// "0,1,5": the numeric values of `ids`, for messages.
template <typename Tag>
std::string JoinIds(const std::vector<Id<Tag>>& ids) {
  return absl::StrJoin(ids, ",", [](std::string* out, Id<Tag> id) { absl::StrAppend(out, id.value()); });
}

using IslandId = Id<IslandTag>;
using HostId = Id<HostTag>;
using DeviceId = Id<DeviceTag>;  // Physical device, unique in the cluster.
using SliceId = Id<SliceTag>;    // A virtual slice handed out by the resource manager.
using ClientId = Id<ClientTag>;
using BufferId = Id<BufferTag>;  // One logical (sharded) buffer.
using FunctionId = Id<FunctionTag>;
using ProgramId = Id<ProgramTag>;
using RunId = Id<RunTag>;        // One submitted execution of a program.

}  // namespace pw
