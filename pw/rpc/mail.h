// Mail between processes of one machine (pw/dataplane's ShmMailbox carrying v1::PeerMail): the
// metadata keys by which a stream's two ends agree to it, and sending one message.
#pragma once

#include "absl/status/status.h"
#include "pw/dataplane/shm_mailbox.h"
#include "pw/rpc/proto/pathways.pb.h"

namespace pw::rpc {

// On a stream that may go by mail: the sender's stub and reply mailbox, the first seq it may
// mail (command streams); the receiver's yes (initial metadata) and limit of runs (sessions).
inline constexpr char kMailStub[] = "pw-mail-stub";
inline constexpr char kReplyMailbox[] = "pw-reply-mailbox";
inline constexpr char kMailKey[] = "pw-mail-key";  // The reply mailbox's key (ShmMailbox::key).
inline constexpr char kMailFirstSeq[] = "pw-mail-first-seq";
inline constexpr char kMailOk[] = "pw-mail-ok";
inline constexpr char kMailLimit[] = "pw-mail-limit";

// Sends `m` to `to`; ResourceExhausted if it does not fit (checked before serializing it) or
// the producers' lock stays taken past `max_spins` tries.
inline absl::Status SendMail(dataplane::ShmMailbox& to, const ::pathways::v1::PeerMail& m,
                             int max_spins = dataplane::ShmMailbox::kDefaultMaxSpins) {
  if (m.ByteSizeLong() > to.max_message_bytes())
    return absl::ResourceExhaustedError("message too large for the mailbox");
  return to.Send(m.SerializeAsString(), max_spins);
}

}  // namespace pw::rpc
