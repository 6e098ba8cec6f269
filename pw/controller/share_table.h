// ShareTable: arrays one client shares with others, behind capability tokens.
//
// A share names one buffer, which its owner (or a holder of a writable token) may re-point at
// another, and records every handle imported through it, so that revoking the share can cut them
// off. Tokens are 128 random bits ("pws-" and 32 hex digits): knowing one is the permission.
// Not thread-safe: the controller serializes it with the buffer table's handles it guards.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "pw/base/ids.h"

namespace pw {

class ShareTable {
 public:
  // Limits, checked here: shares one client owns at once, and a token's length on input.
  static constexpr size_t kMaxSharesPerClient = 1024;
  static constexpr size_t kMaxTokenLength = 64;

  // A new share of `buffer` owned by `owner`; ResourceExhausted past kMaxSharesPerClient.
  absl::StatusOr<std::string> Create(ClientId owner, BufferId buffer, bool writable);
  // Points `token` at `buffer`: allowed to its owner, and to anyone for a writable share.
  absl::Status Repoint(ClientId client, const std::string& token, BufferId buffer);
  // The buffer `token` names now; records that `client` imports it.
  absl::StatusOr<BufferId> Import(ClientId client, const std::string& token);
  // Ends a share (its owner only); returns the (client, buffer) handles imported through it.
  absl::StatusOr<std::vector<std::pair<ClientId, BufferId>>> Revoke(ClientId client,
                                                                    const std::string& token);
  // `owner` has gone: its shares end (their imported handles stay).
  void ForgetOwner(ClientId owner);
  size_t size() const { return shares_.size(); }

 private:
  struct Share {
    ClientId owner;
    BufferId buffer;
    bool writable = false;
    std::vector<std::pair<ClientId, BufferId>> imports;
  };
  absl::StatusOr<Share*> Find(const std::string& token);
  absl::flat_hash_map<std::string, Share> shares_;
  absl::flat_hash_map<ClientId, size_t> owned_;  // Shares per owner; none: absent.
};

}  // namespace pw
