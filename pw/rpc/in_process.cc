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

// The servers of this process by address. Channels are made under the lock, and a name is
// withdrawn only once no InProcessCall holds it, so its server is not shut down while a channel
// or such a call is being made to it (InProcessName's destructor takes the lock first).
struct Served {
  grpc::Server* server = nullptr;
  uint64_t generation = 0;
  int calls = 0;  // InProcessCalls holding it.
};
struct Registry {
  pw::Mutex mu;
  absl::flat_hash_map<std::string, Served> servers ABSL_GUARDED_BY(mu);
  uint64_t last_generation ABSL_GUARDED_BY(mu) = 0;
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
  if (!r.servers.emplace(address, Served{server, r.last_generation + 1, 0}).second)
    return absl::AlreadyExistsError(
        absl::StrCat("another server of this process already serves ", address));
  ++r.last_generation;
  return std::unique_ptr<InProcessName>(new InProcessName(std::move(address)));
}

InProcessName::~InProcessName() {
  Registry& r = Servers();
  pw::MutexLock lock(&r.mu);
  r.mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return r.servers.at(address_).calls == 0; });
  r.servers.erase(address_);
}

InProcessCall::InProcessCall(std::string address, uint64_t generation)
    : address_(std::move(address)) {
  if (!IsInProcess(address_)) return;
  Registry& r = Servers();
  pw::MutexLock lock(&r.mu);
  auto it = r.servers.find(address_);
  ok_ = held_ = it != r.servers.end() && it->second.generation == generation;
  if (held_) ++it->second.calls;
}

InProcessCall::~InProcessCall() {
  if (!held_) return;
  Registry& r = Servers();
  pw::MutexLock lock(&r.mu);
  --r.servers.at(address_).calls;
}

bool InProcessServes(const std::string& address, uint64_t generation) {
  Registry& r = Servers();
  pw::MutexLock lock(&r.mu);
  auto it = r.servers.find(address);
  return it != r.servers.end() && it->second.generation == generation;
}

std::pair<std::shared_ptr<grpc::Channel>, uint64_t> InProcessChannel(
    const std::string& address, const grpc::ChannelArguments& args) {
  {
    Registry& r = Servers();
    pw::MutexLock lock(&r.mu);
    auto it = r.servers.find(address);
    if (it != r.servers.end())
      return {it->second.server->InProcessChannel(args), it->second.generation};
  }
  // A lame channel (gRPC's C API; CreateChannelInternal is in grpcpp/channel.h of 1.51), with the
  // library held open while it is made, as grpc::CreateCustomChannel does.
  const std::string why = absl::StrCat("no server of this process serves ", address);
  grpc_init();
  std::shared_ptr<grpc::Channel> lame = grpc::CreateChannelInternal(
      "", grpc_lame_client_channel_create(address.c_str(), GRPC_STATUS_UNAVAILABLE, why.c_str()),
      {});
  grpc_shutdown();
  return {std::move(lame), 0};
}

}  // namespace pw::rpc
