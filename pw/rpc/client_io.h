// ClientIo: a wire client's side of client I/O beside the controller (ControllerInterface::
// BeginPut, LocateArray): an array's shards go between this process and the workers' bulk
// streams (pw/dataplane/bulk_server.h) under the one-use keys the controller handed out, not
// through the controller.
//
// Up to dataplane::BulkClient::kMaxThreads transfers run at once per worker machine. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "pw/base/host_array.h"
#include "pw/base/mutex.h"
#include "pw/base/sharding.h"
#include "pw/dataplane/bulk_client.h"
#include "pw/transport/messages.h"

namespace pw::rpc {

class ClientIo {
 public:
  // Cuts `value` into each transfer's rank's shard and sends it; returns once all are sent (or
  // why one could not be: its error names the worker).
  // (`bytes`: the array's spec.size_bytes(), unchanged until Send returns.)
  absl::Status Send(const ArraySpec& spec, const uint8_t* bytes, const Sharding& sharding,
                    const std::vector<ShardTransfer>& shards);
  // Reads each transfer's shard (distinct regions of an array of `spec` cut by `sharding`) and
  // assembles the array; `done` runs once, on a transfer's thread.
  void Read(const ArraySpec& spec, const Sharding& sharding, std::vector<ShardTransfer> shards,
            absl::AnyInvocable<void(absl::StatusOr<HostArray>)> done);

 private:
  // The bulk client for `address` ("host:port"; "[v6]:port") and its port.
  absl::StatusOr<std::pair<std::shared_ptr<dataplane::BulkClient>, int>> To(
      const std::string& address);

  pw::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<dataplane::BulkClient>> clients_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pw::rpc
