#include "pw/pjrt/shard_executable.h"

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"

namespace pw::pjrt {

absl::StatusOr<ExecutableRef> PjrtShardExecutable::Compile(
    std::shared_ptr<const PjrtClient> client, const StableHloFunctionDef& def, int num_shards,
    absl::flat_hash_map<DeviceId, int> device_index) {
  PW_RETURN_IF_ERROR(SignatureOf(def, num_shards).status());
  PW_ASSIGN_OR_RETURN(std::unique_ptr<PjrtExecutable> exe,
                      client->Compile(def.name, def.module, def.inputs));
  if (exe->num_outputs() != def.outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "function '", def.name, "' declares ", def.outputs.size(), " outputs but its module has ",
        exe->num_outputs()));
  }
  return ExecutableRef(new PjrtShardExecutable(std::move(client), def, num_shards,
                                               std::move(device_index), std::move(exe)));
}

absl::StatusOr<std::shared_ptr<PjrtBuffer>> PjrtShardExecutable::Stage(
    const DeviceBufferRef& input, size_t i, int device_index, DeviceId device) const {
  if (auto pjrt = std::dynamic_pointer_cast<PjrtBuffer>(input);
      pjrt != nullptr && pjrt->device_index() == device_index &&
      pjrt->spec() == def_.inputs[i]) {
    return pjrt;
  }
  const ArraySpec& want = def_.inputs[i];
  if (input->spec().dtype != want.dtype || input->spec().num_elements() != want.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("function '", def_.name, "' input ", i,
                                                   " expects ", want.ToString(), ", got ",
                                                   input->spec().ToString()));
  }
  // Same elements in another layout or memory: through the host, with the declared shape.
  HostArray staged{want, std::vector<uint8_t>(want.size_bytes())};
  PW_RETURN_IF_ERROR(input->CopyToHost(staged.bytes.data()).status());
  return client_->BufferFromHost(staged, device_index, device);
}

Future<std::vector<DeviceBufferRef>> PjrtShardExecutable::ExecuteShard(
    const ShardLaunch& launch) const {
  using Result = Future<std::vector<DeviceBufferRef>>;
  auto it = device_index_.find(launch.device);
  if (it == device_index_.end()) {
    return Result::Ready(absl::InternalError(absl::StrCat(
        "function '", def_.name, "': ", launch.device.ToString(), " has no PJRT device here")));
  }
  if (launch.inputs.size() != def_.inputs.size()) {
    return Result::Ready(absl::InvalidArgumentError(absl::StrCat(
        "function '", def_.name, "' takes ", def_.inputs.size(), " inputs, got ",
        launch.inputs.size())));
  }
  std::vector<std::shared_ptr<PjrtBuffer>> inputs;
  for (size_t i = 0; i < launch.inputs.size(); ++i) {
    auto b = Stage(launch.inputs[i], i, it->second, launch.device);
    if (!b.ok()) return Result::Ready(b.status());
    inputs.push_back(*std::move(b));
  }
  Promise<std::vector<DeviceBufferRef>> p;
  Result f = p.future();
  exe_->Execute(inputs, it->second, launch.device)
      .OnReady([p = std::move(p)](
                   const absl::StatusOr<std::vector<std::shared_ptr<PjrtBuffer>>>& r) mutable {
        if (!r.ok()) return p.Set(r.status());
        p.Set(std::vector<DeviceBufferRef>(r->begin(), r->end()));
      });
  return f;
}

}  // namespace pw::pjrt
