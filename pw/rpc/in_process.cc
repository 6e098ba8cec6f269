#include "pw/rpc/in_process.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpcpp/channel.h"
#include "pw/base/mutex.h"

namespace pw::rpc {
namespace {

// The servers of this process by address. Channels are made under the lock, so a server is not
// shut down while one is being made to it (InProcessName's destructor takes the lock first).
struct Registry {
  pw::Mutex mu;
  absl::flat_hash_map<std::string, grpc::Server*> servers ABSL_GUARDED_BY(mu);
};

Registry& Servers() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

bool IsInProcess(absl::string_view address) {
  return absl::StartsWith(address, kInProcessScheme) && address.size() > kInProcessScheme.size();
}

absl::StatusOr<std::unique_ptr<InProcessName>> InProcessName::Register(std::string address,
                                                                       grpc::Server* server) {
  if (!IsInProcess(address))
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not an in-process address (inproc:NAME)"));
  Registry& r = Servers();
  pw::MutexLock lock(&r.mu);
  if (!r.servers.emplace(address, server).second)
    return absl::AlreadyExistsError(
        absl::StrCat("another server of this process already serves ", address));
  return std::unique_ptr<InProcessName>(new InProcessName(std::move(address)));
}

InProcessName::~InProcessName() {
  Registry& r = Servers();
  pw::MutexLock lock(&r.mu);
  r.servers.erase(address_);
}

bool InProcessServed(const std::string& address) {
  Registry& r = Servers();
  pw::MutexLock lock(&r.mu);
  return r.servers.contains(address);
}

std::shared_ptr<grpc::Channel> InProcessChannel(const std::string& address,
                                                const grpc::ChannelArguments& args) {
  Registry& r = Servers();
  pw::MutexLock lock(&r.mu);
  auto it = r.servers.find(address);
  if (it != r.servers.end()) return it->second->InProcessChannel(args);
  const std::string why = absl::StrCat("no server of this process serves ", address);
  return grpc::CreateChannelInternal(
      "", grpc_lame_client_channel_create(address.c_str(), GRPC_STATUS_UNAVAILABLE, why.c_str()),
      {});
}

}  // namespace pw::rpc
