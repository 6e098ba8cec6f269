#include "pw/controller/share_table.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pw {

namespace {
std::string NewToken() {
  std::random_device rd;  // The kernel's randomness (getrandom / /dev/urandom).
  return absl::StrFormat("pws-%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}
}  // namespace

absl::StatusOr<std::string> ShareTable::Create(ClientId owner, BufferId buffer, bool writable) {
  size_t& owned = owned_[owner];
  if (owned >= kMaxSharesPerClient)
    return absl::ResourceExhaustedError(absl::StrCat(
        owner.ToString(), " already owns ", owned, " shares, the limit: revoke some first"));
  std::string token = NewToken();
  while (shares_.contains(token)) token = NewToken();
  shares_.emplace(token, Share{owner, buffer, writable, {}});
  ++owned;
  return token;
}

absl::StatusOr<ShareTable::Share*> ShareTable::Find(const std::string& token) {
  if (token.size() > kMaxTokenLength)
    return absl::InvalidArgumentError(absl::StrCat("a share token has at most ", kMaxTokenLength,
                                                   " characters; got ", token.size()));
  auto it = shares_.find(token);
  if (it == shares_.end())
    return absl::NotFoundError(
        "no share has this token (never made, revoked, or its owner has disconnected)");
  return &it->second;
}

absl::Status ShareTable::Repoint(ClientId client, const std::string& token, BufferId buffer) {
  absl::StatusOr<Share*> s = Find(token);
  if (!s.ok()) return s.status();
  if ((*s)->owner != client && !(*s)->writable)
    return absl::PermissionDeniedError(
        "this share is read-only: only its owner may point it at another array");
  (*s)->buffer = buffer;
  return absl::OkStatus();
}

absl::StatusOr<BufferId> ShareTable::Import(ClientId client, const std::string& token) {
  absl::StatusOr<Share*> s = Find(token);
  if (!s.ok()) return s.status();
  (*s)->imports.emplace_back(client, (*s)->buffer);
  return (*s)->buffer;
}

absl::StatusOr<std::vector<std::pair<ClientId, BufferId>>> ShareTable::Revoke(
    ClientId client, const std::string& token) {
  absl::StatusOr<Share*> s = Find(token);
  if (!s.ok()) return s.status();
  if ((*s)->owner != client)
    return absl::PermissionDeniedError("only the share's owner may revoke it");
  std::vector<std::pair<ClientId, BufferId>> imports = std::move((*s)->imports);
  if (--owned_[client] == 0) owned_.erase(client);
  shares_.erase(token);
  return imports;
}

void ShareTable::ForgetOwner(ClientId owner) {
  absl::erase_if(shares_, [owner](const auto& kv) { return kv.second.owner == owner; });
  owned_.erase(owner);
}

}  // namespace pw
