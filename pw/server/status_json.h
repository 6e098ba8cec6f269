// The cluster status as one JSON object: what `pw status --json` prints and what the Python
// client's pathways.status() returns (one builder for both).
#pragma once

#include <string>

#include "pw/rpc/proto/pathways.pb.h"
#include "pw/transport/controller_interface.h"

namespace pw::server {

// `status` as a controller process serves it (RemoteController::FullStatus: members and the
// client count set); `address` is the cluster's.
std::string StatusJson(const ::pathways::v1::ClusterStatus& status, const std::string& address);
// An embedded cluster's (`address` "embedded"): every host in this process, those that failed
// (EmbeddedCluster::FailHost) not alive, with the reason, as a process cluster lists them.
std::string StatusJson(const ClusterStatus& status, int64_t clients);

}  // namespace pw::server
