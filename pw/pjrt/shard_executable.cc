#include "pw/pjrt/shard_executable.h"

#include <cstring>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/pjrt/runtime_collectives.h"

namespace pw::pjrt {

absl::StatusOr<ExecutableRef> PjrtShardExecutable::Compile(
    std::shared_ptr<PjrtBackend> backend, const StableHloFunctionDef& def,
    absl::Span<const DeviceId> slice_devices) {
  const int num_shards = static_cast<int>(slice_devices.size());
  PW_RETURN_IF_ERROR(SignatureOf(def, num_shards).status());
  PW_ASSIGN_OR_RETURN(auto client, backend->Client());
  if (def.collective_axis_size > 0)
    PW_RETURN_IF_ERROR(Annotate(backend->RuntimeCollectives(),
                                absl::StrCat("function '", def.name, "'")));
  std::vector<ArraySpec> pjrt_inputs = def.inputs;
  std::vector<int> placement;
  if (def.num_partitions > 1) {
    for (ArraySpec& s : pjrt_inputs) {
      std::vector<int64_t> dims = {1};
      dims.insert(dims.end(), s.shape.dims().begin(), s.shape.dims().end());
      s.shape = Shape(std::move(dims));
    }
    for (DeviceId d : slice_devices) {
      int index = backend->IndexOf(d);
      if (index < 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "function '", def.name, "' is an SPMD XLA computation over ", num_shards,
            " devices, but ", d.ToString(), " is not a device of this process's PJRT client: "
            "XLA's own collectives cannot span worker processes on the CPU plugin, so an SPMD "
            "module's slice must lie within one worker process (export the function per shard "
            "with runtime collectives instead, as pw.pmap(..., axis_name=...) does; or ask for "
            "a slice on one host)"));
      }
      placement.push_back(index);
    }
  }
  PW_ASSIGN_OR_RETURN(std::shared_ptr<const PjrtExecutable> exe,
                      backend->Compile(def.name, def.module, pjrt_inputs, std::move(placement)));
  if (exe->num_outputs() != def.outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "function '", def.name, "' declares ", def.outputs.size(), " outputs but its module has ",
        exe->num_outputs()));
  }
  return ExecutableRef(new PjrtShardExecutable(std::move(backend), std::move(client), def,
                                               num_shards, std::move(pjrt_inputs),
                                               std::move(exe)));
}

absl::StatusOr<std::shared_ptr<const PjrtExecutable>> PjrtShardExecutable::Precompile(
    const std::shared_ptr<PjrtBackend>& backend, const StableHloFunctionDef& def) {
  if (def.num_partitions != 1)
    return absl::InvalidArgumentError(absl::StrCat("function '", def.name,
                                                   "' is an SPMD module: it compiles per slice"));
  return backend->Compile(def.name, def.module, def.inputs, {});
}

PjrtShardExecutable::PjrtShardExecutable(std::shared_ptr<PjrtBackend> backend,
                                         std::shared_ptr<const PjrtClient> client,
                                         StableHloFunctionDef def, int num_shards,
                                         std::vector<ArraySpec> pjrt_inputs,
                                         std::shared_ptr<const PjrtExecutable> exe)
    : backend_(std::move(backend)), client_(std::move(client)), def_(std::move(def)),
      num_shards_(num_shards), pjrt_inputs_(std::move(pjrt_inputs)), exe_(std::move(exe)) {
  for (const ArraySpec& spec : pjrt_inputs_) {
    std::vector<const void*>& keys = staging_keys_.emplace_back();
    for (int d = 0; d < client_->num_devices(); ++d) keys.push_back(backend_->StagingKey(d, spec));
  }
}

absl::StatusOr<std::shared_ptr<PjrtBuffer>> PjrtShardExecutable::Stage(
    const DeviceBufferRef& input, size_t i, int device_index, DeviceId device) const {
  const ArraySpec& want = def_.inputs[i];
  if (auto pjrt = std::dynamic_pointer_cast<PjrtBuffer>(input);
      pjrt != nullptr && pjrt->device_index() == device_index &&
      pjrt->pjrt_spec() == pjrt_inputs_[i]) {
    return pjrt;
  }
  if (input->spec().dtype != want.dtype || input->spec().num_elements() != want.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("function '", def_.name, "' input ", i,
                                                   " expects ", want.ToString(), ", got ",
                                                   input->spec().ToString()));
  }
  // Same elements in another layout or memory: through the host, with the declared shape, once.
  const void* key = staging_keys_[i][device_index];
  if (auto mirror = std::static_pointer_cast<PjrtBuffer>(input->Mirror(key))) return mirror;
  HostArray staged{want, Bytes(want.size_bytes())};
  PW_RETURN_IF_ERROR(input->CopyToHost(staged.bytes.data()).status());
  PW_ASSIGN_OR_RETURN(std::shared_ptr<PjrtBuffer> copy,
                      client_->BufferFromHost(staged, device_index, device, &pjrt_inputs_[i].shape));
  input->SetMirror(key, copy);
  return copy;
}

Future<std::vector<DeviceBufferRef>> PjrtShardExecutable::ExecuteShard(
    const ShardLaunch& launch) const {
  Run run = Launch(launch);
  if (run.ran.has_value()) return Future<std::vector<DeviceBufferRef>>::Ready(*std::move(run.ran));
  Promise<std::vector<DeviceBufferRef>> p;
  Future<std::vector<DeviceBufferRef>> f = p.future();
  run.outputs.OnReady([p = std::move(p), computed = run.computed](
                          const absl::StatusOr<std::vector<DeviceBufferRef>>& r) mutable {
    if (!r.ok()) return p.Set(r.status());
    computed.OnReady([p = std::move(p), outs = *r](const absl::Status& s) mutable {
      if (!s.ok()) return p.Set(s);
      p.Set(std::move(outs));
    });
  });
  return f;
}

Executable::Run PjrtShardExecutable::Launch(const ShardLaunch& launch) const {
  using Outputs = Future<std::vector<DeviceBufferRef>>;
  auto fail = [](absl::Status s) { return Run{Outputs::Ready(s), Future<>::Ready(s)}; };
  const int index = backend_->IndexOf(launch.device);
  if (index < 0) {
    return fail(absl::InternalError(absl::StrCat(
        "function '", def_.name, "': ", launch.device.ToString(), " has no PJRT device here")));
  }
  if (launch.inputs.size() != def_.inputs.size()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "function '", def_.name, "' takes ", def_.inputs.size(), " inputs, got ",
        launch.inputs.size())));
  }
  std::vector<std::shared_ptr<PjrtBuffer>> inputs;
  for (size_t i = 0; i < launch.inputs.size(); ++i) {
    auto b = Stage(launch.inputs[i], i, index, launch.device);
    if (!b.ok()) return fail(b.status());
    inputs.push_back(*std::move(b));
  }
  // The partitions of one launch (one node of one run) share its id; nonzero.
  const int launch_id =
      exe_->num_partitions() > 1
          ? static_cast<int>((absl::HashOf(launch.key.run, launch.key.node) & 0x7fffffff) | 1)
          : 0;
  absl::StatusOr<PjrtExecutable::Launched> launched;
  if (def_.collective_axis_size > 0) {
    // Runs to the end here, on the device thread, so the device meets its peers in the island's
    // gang order; the handlers find the launch in the execute context.
    CollectiveLaunch collective(launch.key, launch.rank, launch.slice_devices, launch.collectives);
    const PjrtPlugin& plugin = *client_->plugin();
    launched = exe_->Launch(inputs, index, launch.device, 0, def_.outputs,
                            [&](PJRT_ExecuteContext* context) {
                              return AddCollectiveLaunch(plugin, context, &collective);
                            });
  } else {
    launched = exe_->Launch(inputs, index, launch.device, launch_id, def_.outputs);
  }
  if (!launched.ok()) return fail(launched.status());
  std::vector<DeviceBufferRef> outputs(launched->outputs.begin(), launched->outputs.end());
  // An SPMD partition's results are whole only if no partition of its launch ran as a stand-in.
  auto whole = [key = launch.key, collectives = launch.collectives,
                spmd = exe_->num_partitions() > 1](absl::Status computed) {
    if (computed.ok() && spmd && collectives != nullptr)
      computed = collectives->LaunchFailure(key.run, key.node);
    return computed;
  };
  // Run already (the CPU plugin, inputs ready): complete inline, as native kernels do.
  if (!launched->computed.valid() || launched->computed.IsReady()) {
    const absl::Status computed =
        whole(launched->computed.valid() ? launched->computed.status() : absl::OkStatus());
    if (!computed.ok()) return Run{.ran = computed};
    return Run{.ran = std::move(outputs)};
  }
  if (exe_->num_partitions() <= 1) return Run{Outputs::Ready(std::move(outputs)), launched->computed};
  Promise<> checked;
  Future<> computed = checked.future();
  launched->computed.OnReady([whole = std::move(whole), checked = std::move(checked)](
                                 const absl::Status& s) mutable { checked.Set(whole(s)); });
  return Run{Outputs::Ready(std::move(outputs)), std::move(computed)};
}

void PjrtShardExecutable::RunStandIn(const ShardLaunch& launch) const {
  if (exe_->num_partitions() <= 1) return;  // Per-shard: its peers meet in the runtime.
  ShardLaunch zeros = launch;
  zeros.inputs.clear();
  for (const ArraySpec& spec : def_.inputs) {
    auto buffer = HostDeviceBuffer::Create(spec, launch.device);
    std::memset(buffer->mutable_data(), 0, spec.size_bytes());
    zeros.inputs.push_back(std::move(buffer));
  }
  Run run = Launch(zeros);
  if (!run.ran.has_value() && run.computed.valid()) run.computed.Await();  // Its result goes.
}

}  // namespace pw::pjrt
