// The cluster status as one JSON object: what `pw status --json` prints and what the Python
// client's pathways.status() returns (one builder for both).
#pragma once

#include <string>

#include "pw/rpc/proto/pathways.pb.h"

namespace pw::server {

// `status` as a controller process serves it (RemoteController::FullStatus: members and the
// client count set), or an embedded cluster's (no members: every host reads as alive, with
// address "in-process"). `address` is the cluster's ("embedded" for one in this process).
std::string StatusJson(const ::pathways::v1::ClusterStatus& status, const std::string& address);

}  // namespace pw::server
