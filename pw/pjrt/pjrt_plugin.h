// PJRT backend: XLA compiled functions through a PJRT C API plugin loaded at run time.
//
// PjrtPlugin loads a plugin (dlopen + GetPjrtApi), checks its C API version against the header we
// build with (pjrt_c_api.h from the installed xla-cpu-pjrt wheel: the plugin's major version must
// match and its function table must cover ours) and initializes it. PjrtClient wraps one
// PJRT_Client: its devices, compiling StableHLO into PjrtExecutables, and moving arrays in and out
// of PJRT buffers. Buffers are owned by the backend (PjrtBuffer is a DeviceBuffer over a
// PJRT_Buffer) and completion is a PJRT event, surfaced as a pw::Future.
//
// Thread-safety: all classes are thread-safe (PJRT clients, executables and buffers are).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "pw/base/future.h"
#include "pw/base/host_array.h"
#include "pw/executor/device_buffer.h"
#include "pjrt_c_api.h"  // From the installed xla-cpu-pjrt wheel (see CMakeLists.txt).

namespace pw::pjrt {

class PjrtPlugin {
 public:
  // Errors: NotFound if `path` cannot be opened (with the loader's message), InvalidArgument if it
  // does not export GetPjrtApi or its API version is incompatible, or the plugin's own error.
  static absl::StatusOr<std::shared_ptr<const PjrtPlugin>> Load(const std::string& path);

  const PJRT_Api* api() const { return api_; }
  const std::string& path() const { return path_; }
  int major_version() const { return api_->pjrt_api_version.major_version; }
  int minor_version() const { return api_->pjrt_api_version.minor_version; }
  // Converts a PJRT error into a Status prefixed with `what` and destroys it; OK for nullptr.
  absl::Status Consume(PJRT_Error* error, absl::string_view what) const;
  // A future for `event` (which it takes over and destroys once ready).
  Future<> Await(PJRT_Event* event, std::string what) const;

 private:
  PjrtPlugin(std::string path, const PJRT_Api* api) : path_(std::move(path)), api_(api) {}
  const std::string path_;
  const PJRT_Api* const api_;
};

class PjrtExecutable;

// One shard in a PJRT buffer. `spec()` is the runtime's view of it; `pjrt_spec()` is the PJRT
// buffer's own shape, which may differ by unit dimensions (an SPMD partition of a pmap-style
// function holds shard i as a [1, ...] block): same elements, same row-major bytes.
class PjrtBuffer final : public DeviceBuffer {
 public:
  PjrtBuffer(std::shared_ptr<const PjrtPlugin> plugin, PJRT_Buffer* buffer, ArraySpec spec,
             DeviceId device, int device_index, ArraySpec pjrt_spec);
  ~PjrtBuffer() override;
  PJRT_Buffer* get() const { return buffer_; }
  const ArraySpec& pjrt_spec() const { return pjrt_spec_; }
  // Index of the client device holding the buffer.
  int device_index() const { return device_index_; }
  // A CPU plugin's ready, dense row-major buffer is copied on the calling thread (it is host
  // memory); any other through PJRT_Buffer_ToHostBuffer, which the CPU plugin runs on its
  // thread pool: a wake-up and a hop per read, as a peer's fetch of a small shard is.
  Future<> CopyToHost(void* dst) const override;

 private:
  // The buffer's bytes, where they can be read in place now: on CPU, ready without error, dense
  // row-major (no tiles); else nullptr.
  const void* ReadyHostBytes() const;
  const std::shared_ptr<const PjrtPlugin> plugin_;
  PJRT_Buffer* const buffer_;
  const int device_index_;
  const ArraySpec pjrt_spec_;
};

class PjrtClient {
 public:
  // `cpu_device_count` > 0 asks a CPU plugin for that many devices (its "cpu_device_count"
  // create option; one host's devices of a slice), executing synchronously where the plugin
  // allows ("asynchronous" = false): a computation whose inputs are ready runs on the thread that
  // launches it. 0 keeps the plugin's defaults.
  static absl::StatusOr<std::unique_ptr<PjrtClient>> Create(
      std::shared_ptr<const PjrtPlugin> plugin, int cpu_device_count = 0);
  ~PjrtClient();

  const std::shared_ptr<const PjrtPlugin>& plugin() const { return plugin_; }
  std::string platform_name() const;
  int num_devices() const { return static_cast<int>(devices_.size()); }

  // Compiles a StableHLO module (portable artifact bytecode or MLIR text). `inputs` are the
  // function's static per-shard input specs, checked at every call. Errors name `name`.
  // With no `partition_devices`: for one device, as a portable executable that runs on whichever
  // client device Execute names. With them: an SPMD module of partition_devices.size() partitions
  // (collectives inside), partition p placed on client device partition_devices[p]; Execute then
  // runs one partition per call, and the partitions of one launch meet in their collectives.
  absl::StatusOr<std::unique_ptr<PjrtExecutable>> Compile(
      const std::string& name, absl::string_view stablehlo, std::vector<ArraySpec> inputs,
      absl::Span<const int> partition_devices = {}) const;
  // Copies `value` into a new buffer on device `device_index`, labelled `device`. With
  // `pjrt_shape` (same number of elements), the PJRT buffer has that shape and `value.spec` is
  // the runtime's view of it.
  absl::StatusOr<std::shared_ptr<PjrtBuffer>> BufferFromHost(
      const HostArray& value, int device_index, DeviceId device = DeviceId(),
      const Shape* pjrt_shape = nullptr) const;

 private:
  PjrtClient(std::shared_ptr<const PjrtPlugin> plugin, PJRT_Client* client);
  const std::shared_ptr<const PjrtPlugin> plugin_;
  PJRT_Client* const client_;
  std::vector<PJRT_Device*> devices_;
  std::vector<int64_t> device_ids_;  // PJRT global device ids, by index.
};

// xla.CompileOptionsProto bytes for `num_partitions` SPMD partitions placed on the devices with
// PJRT ids `device_ids` (empty: one portable single-device executable). Exposed for tests.
std::string CompileOptionsBytes(absl::Span<const int64_t> device_ids);

class PjrtExecutable {
 public:
  ~PjrtExecutable();
  const std::string& name() const { return name_; }
  const std::vector<ArraySpec>& input_specs() const { return inputs_; }
  size_t num_outputs() const { return num_outputs_; }
  // Number of SPMD partitions (1: a portable single-device executable).
  int num_partitions() const { return num_partitions_; }
  // Runs on the client's device `device_index` (for SPMD executables: the partition placed
  // there); the future holds the outputs (labelled with `device`) once computed. Inputs must be on
  // that device and match the declared specs (InvalidArgument naming the function and input
  // otherwise; inputs are checked by their pjrt_spec()). The partitions of one SPMD launch must
  // share a nonzero `launch_id`. `output_views`, if given, are the runtime's specs for the
  // outputs (each with as many elements as the output).
  Future<std::vector<std::shared_ptr<PjrtBuffer>>> Execute(
      absl::Span<const std::shared_ptr<PjrtBuffer>> inputs, int device_index = 0,
      DeviceId device = DeviceId(0), int launch_id = 0,
      absl::Span<const ArraySpec> output_views = {}) const;
  // As Execute, but returns the output buffers as soon as the computation is enqueued (inputs
  // may themselves still be being computed: PJRT orders the work), with `computed` ready when it
  // has run. Reading an output waits for its data.
  struct Launched {
    std::vector<std::shared_ptr<PjrtBuffer>> outputs;
    Future<> computed;
  };
  // With `prepare_context`, the execution gets a PJRT execute context that it fills in (FFI user
  // data: runtime_collectives.h), and Launch returns only once the computation has run (the
  // context lives until then), with `computed` ready.
  using PrepareContext = absl::FunctionRef<absl::Status(PJRT_ExecuteContext*)>;
  absl::StatusOr<Launched> Launch(absl::Span<const std::shared_ptr<PjrtBuffer>> inputs,
                                  int device_index, DeviceId device, int launch_id = 0,
                                  absl::Span<const ArraySpec> output_views = {},
                                  std::optional<PrepareContext> prepare_context = {}) const;

 private:
  friend class PjrtClient;
  PjrtExecutable(std::shared_ptr<const PjrtPlugin> plugin, std::string name,
                 PJRT_LoadedExecutable* exe, std::vector<ArraySpec> inputs, size_t num_outputs,
                 std::vector<PJRT_Device*> devices, int num_partitions)
      : plugin_(std::move(plugin)), name_(std::move(name)), exe_(exe),
        inputs_(std::move(inputs)), num_outputs_(num_outputs), devices_(std::move(devices)),
        num_partitions_(num_partitions) {}
  const std::shared_ptr<const PjrtPlugin> plugin_;
  const std::string name_;
  PJRT_LoadedExecutable* const exe_;
  const std::vector<ArraySpec> inputs_;
  const size_t num_outputs_;
  const std::vector<PJRT_Device*> devices_;
  const int num_partitions_;
  // The outputs' PJRT specs (static shapes: the same at every launch), read from the first
  // launch's buffers under output_specs_once_ and immutable after it.
  mutable absl::once_flag output_specs_once_;
  mutable std::vector<ArraySpec> output_specs_;
  mutable absl::Status output_specs_status_;
};

// The CPU plugin to use when none is configured: $PW_PJRT_PLUGIN if set, else the one installed
// in the repository's .venv when this was built.
std::string DefaultCpuPluginPath();

// PJRT element type <-> DType.
absl::StatusOr<PJRT_Buffer_Type> ToPjrtType(DType t);
absl::StatusOr<DType> FromPjrtType(PJRT_Buffer_Type t);

}  // namespace pw::pjrt
