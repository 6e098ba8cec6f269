#include "pw/pjrt/pjrt_plugin.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "pw/base/log_level.h"
#include "pw/base/status_macros.h"

namespace pw::pjrt {

namespace {

// Zero-initialized PJRT argument struct with its struct_size set (our header's size: the plugin
// reads only the fields it knows of our version).
template <typename T>
T Args(size_t size) {
  T a{};
  a.struct_size = size;
  return a;
}
#define PW_PJRT_ARGS(T) Args<T>(T##_STRUCT_SIZE)

absl::StatusCode CodeOf(PJRT_Error_Code c) {
  // PJRT_Error_Code mirrors absl::StatusCode's values.
  int v = static_cast<int>(c);
  return v >= 0 && v <= 16 ? static_cast<absl::StatusCode>(v) : absl::StatusCode::kUnknown;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const PjrtPlugin>> PjrtPlugin::Load(const std::string& path) {
  ApplyLogLevelToXla();  // PW_LOG_LEVEL: the plugin reads its log level as it loads.
  // RTLD_LOCAL: plugins bundle their own copies of XLA's dependencies.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    return absl::NotFoundError(absl::StrCat("cannot load PJRT plugin '", path,
                                            "': ", e ? e : "dlopen failed"));
  }
  using GetApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    dlclose(handle);
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not a PJRT plugin: it does not export the symbol GetPjrtApi"));
  }
  const PJRT_Api* api = get_api();
  if (api == nullptr)
    return absl::InternalError(absl::StrCat("PJRT plugin '", path, "': GetPjrtApi returned null"));
  const int major = api->pjrt_api_version.major_version;
  const int minor = api->pjrt_api_version.minor_version;
  if (major != PJRT_API_MAJOR || api->struct_size < PJRT_Api_STRUCT_SIZE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PJRT plugin '", path, "' implements C API ", major, ".", minor, " (", api->struct_size,
        "-byte function table); pathways is built against ", PJRT_API_MAJOR, ".", PJRT_API_MINOR,
        " and needs the same major version and a table of at least ", PJRT_Api_STRUCT_SIZE,
        " bytes"));
  }
  // Plugins are never unloaded: their static state outlives any one client.
  std::shared_ptr<const PjrtPlugin> plugin(new PjrtPlugin(path, api));
  auto init = PW_PJRT_ARGS(PJRT_Plugin_Initialize_Args);
  PW_RETURN_IF_ERROR(plugin->Consume(api->PJRT_Plugin_Initialize(&init),
                                     absl::StrCat("initializing PJRT plugin '", path, "'")));
  return plugin;
}

absl::Status PjrtPlugin::Consume(PJRT_Error* error, absl::string_view what) const {
  if (error == nullptr) return absl::OkStatus();
  auto msg = PW_PJRT_ARGS(PJRT_Error_Message_Args);
  msg.error = error;
  api_->PJRT_Error_Message(&msg);
  auto code = PW_PJRT_ARGS(PJRT_Error_GetCode_Args);
  code.error = error;
  absl::StatusCode c = absl::StatusCode::kUnknown;
  if (api_->PJRT_Error_GetCode(&code) == nullptr) c = CodeOf(code.code);
  if (c == absl::StatusCode::kOk) c = absl::StatusCode::kUnknown;
  absl::Status s(c, absl::StrCat(what, ": ", absl::string_view(msg.message, msg.message_size)));
  auto destroy = PW_PJRT_ARGS(PJRT_Error_Destroy_Args);
  destroy.error = error;
  api_->PJRT_Error_Destroy(&destroy);
  return s;
}

namespace {
struct EventWaiter {
  const PjrtPlugin* plugin;
  PJRT_Event* event;
  std::string what;
  Promise<> promise;
};
}  // namespace

Future<> PjrtPlugin::Await(PJRT_Event* event, std::string what) const {
  if (event == nullptr) return Future<>::Ready(absl::OkStatus());
  auto* w = new EventWaiter{this, event, std::move(what), Promise<>()};
  Future<> f = w->promise.future();
  auto args = PW_PJRT_ARGS(PJRT_Event_OnReady_Args);
  args.event = event;
  args.user_arg = w;
  // Runs on a plugin thread (or at once): fulfil, then destroy the event.
  args.callback = [](PJRT_Error* error, void* arg) {
    auto* w = static_cast<EventWaiter*>(arg);
    absl::Status s = w->plugin->Consume(error, w->what);
    auto destroy = Args<PJRT_Event_Destroy_Args>(PJRT_Event_Destroy_Args_STRUCT_SIZE);
    destroy.event = w->event;
    w->plugin->Consume(w->plugin->api()->PJRT_Event_Destroy(&destroy), "destroying event")
        .IgnoreError();
    Promise<> p = std::move(w->promise);
    delete w;
    p.Set(s);
  };
  absl::Status s = Consume(api_->PJRT_Event_OnReady(&args), w->what);
  if (!s.ok()) {
    auto destroy = PW_PJRT_ARGS(PJRT_Event_Destroy_Args);
    destroy.event = event;
    Consume(api_->PJRT_Event_Destroy(&destroy), "destroying event").IgnoreError();
    w->promise.Set(s);
    delete w;
  }
  return f;
}

std::string DefaultCpuPluginPath() {
  if (const char* env = std::getenv("PW_PJRT_PLUGIN"); env != nullptr && *env != '\0') return env;
  return PW_DEFAULT_PJRT_CPU_PLUGIN;
}

// ---- Types

absl::StatusOr<PJRT_Buffer_Type> ToPjrtType(DType t) {
  switch (t) {
    case DType::kPred: return PJRT_Buffer_Type_PRED;
    case DType::kS8: return PJRT_Buffer_Type_S8;
    case DType::kS32: return PJRT_Buffer_Type_S32;
    case DType::kS64: return PJRT_Buffer_Type_S64;
    case DType::kU8: return PJRT_Buffer_Type_U8;
    case DType::kU32: return PJRT_Buffer_Type_U32;
    case DType::kF16: return PJRT_Buffer_Type_F16;
    case DType::kBF16: return PJRT_Buffer_Type_BF16;
    case DType::kF32: return PJRT_Buffer_Type_F32;
    case DType::kF64: return PJRT_Buffer_Type_F64;
    case DType::kS16: return PJRT_Buffer_Type_S16;
    case DType::kU16: return PJRT_Buffer_Type_U16;
    case DType::kU64: return PJRT_Buffer_Type_U64;
    case DType::kC64: return PJRT_Buffer_Type_C64;
    case DType::kInvalid: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("dtype ", DTypeName(t), " has no PJRT type"));
}

absl::StatusOr<DType> FromPjrtType(PJRT_Buffer_Type t) {
  for (int i = static_cast<int>(DType::kPred); i <= static_cast<int>(DType::kLast); ++i) {
    const DType d = static_cast<DType>(i);
    if (*ToPjrtType(d) == t) return d;
  }
  return absl::UnimplementedError(absl::StrCat("PJRT element type ", static_cast<int>(t),
                                               " is not supported"));
}

// ---- Buffers

PjrtBuffer::PjrtBuffer(std::shared_ptr<const PjrtPlugin> plugin, PJRT_Buffer* buffer,
                       ArraySpec spec, DeviceId device, int device_index, ArraySpec pjrt_spec)
    : DeviceBuffer(std::move(spec), device),
      plugin_(std::move(plugin)),
      buffer_(buffer),
      device_index_(device_index),
      pjrt_spec_(std::move(pjrt_spec)) {}

PjrtBuffer::~PjrtBuffer() {
  auto args = PW_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  args.buffer = buffer_;
  plugin_->Consume(plugin_->api()->PJRT_Buffer_Destroy(&args), "destroying PJRT buffer")
      .IgnoreError();
}

const void* PjrtBuffer::ReadyHostBytes() const {
  const PJRT_Api* api = plugin_->api();
  if (api->PJRT_Buffer_IsOnCpu == nullptr || api->PJRT_Buffer_ReadyEvent == nullptr ||
      api->PJRT_Event_IsReady == nullptr || api->PJRT_Event_Error == nullptr ||
      api->PJRT_Buffer_GetMemoryLayout == nullptr || api->PJRT_Buffer_UnsafePointer == nullptr)
    return nullptr;
  auto on_cpu = PW_PJRT_ARGS(PJRT_Buffer_IsOnCpu_Args);
  on_cpu.buffer = buffer_;
  if (!plugin_->Consume(api->PJRT_Buffer_IsOnCpu(&on_cpu), "").ok() || !on_cpu.is_on_cpu)
    return nullptr;
  auto ready = PW_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = buffer_;
  if (!plugin_->Consume(api->PJRT_Buffer_ReadyEvent(&ready), "").ok()) return nullptr;
  auto is_ready = PW_PJRT_ARGS(PJRT_Event_IsReady_Args);
  is_ready.event = ready.event;
  bool ok = plugin_->Consume(api->PJRT_Event_IsReady(&is_ready), "").ok() && is_ready.is_ready;
  if (ok) {
    auto error = PW_PJRT_ARGS(PJRT_Event_Error_Args);
    error.event = ready.event;
    ok = plugin_->Consume(api->PJRT_Event_Error(&error), "").ok();  // The slow path says why.
  }
  auto destroy = PW_PJRT_ARGS(PJRT_Event_Destroy_Args);
  destroy.event = ready.event;
  plugin_->Consume(api->PJRT_Event_Destroy(&destroy), "").IgnoreError();
  if (!ok) return nullptr;
  auto layout = PW_PJRT_ARGS(PJRT_Buffer_GetMemoryLayout_Args);
  layout.buffer = buffer_;
  if (!plugin_->Consume(api->PJRT_Buffer_GetMemoryLayout(&layout), "").ok() ||
      layout.layout.type != PJRT_Buffer_MemoryLayout_Type_Tiled)
    return nullptr;
  const PJRT_Buffer_MemoryLayout_Tiled& tiled = layout.layout.tiled;
  const size_t rank = static_cast<size_t>(pjrt_spec_.shape.rank());
  if (tiled.num_tiles != 0 || tiled.minor_to_major_size != rank) return nullptr;
  for (size_t i = 0; i < rank; ++i) {
    if (tiled.minor_to_major[i] != static_cast<int64_t>(rank - 1 - i)) return nullptr;
  }
  auto pointer = PW_PJRT_ARGS(PJRT_Buffer_UnsafePointer_Args);
  pointer.buffer = buffer_;
  if (!plugin_->Consume(api->PJRT_Buffer_UnsafePointer(&pointer), "").ok()) return nullptr;
  return reinterpret_cast<const void*>(pointer.buffer_pointer);
}

Future<> PjrtBuffer::CopyToHost(void* dst) const {
  const size_t size = static_cast<size_t>(size_bytes());
  if (size > 0 && pjrt_spec_.size_bytes() == size_bytes()) {
    if (const void* bytes = ReadyHostBytes(); bytes != nullptr) {
      std::memcpy(dst, bytes, size);
      return Future<>::Ready(absl::OkStatus());
    }
  }
  auto args = PW_PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = buffer_;
  args.dst = dst;
  args.dst_size = static_cast<size_t>(size_bytes());
  absl::Status s =
      plugin_->Consume(plugin_->api()->PJRT_Buffer_ToHostBuffer(&args), "copying buffer to host");
  if (!s.ok()) return Future<>::Ready(s);
  return plugin_->Await(args.event, "copying buffer to host");
}

// ---- Client

PjrtClient::PjrtClient(std::shared_ptr<const PjrtPlugin> plugin, PJRT_Client* client)
    : plugin_(std::move(plugin)), client_(client) {}

absl::StatusOr<std::unique_ptr<PjrtClient>> PjrtClient::Create(
    std::shared_ptr<const PjrtPlugin> plugin, int cpu_device_count) {
  const PJRT_Api* api = plugin->api();
  if (cpu_device_count < 0)
    return absl::InvalidArgumentError(absl::StrCat("cpu_device_count must be >= 0, got ",
                                                   cpu_device_count));
  // A scalar create option; `name` must outlive the call.
  auto option = [](absl::string_view name, PJRT_NamedValue_Type type) {
    auto v = PW_PJRT_ARGS(PJRT_NamedValue);
    v.name = name.data();
    v.name_size = name.size();
    v.type = type;
    v.value_size = 1;
    return v;
  };
  std::vector<PJRT_NamedValue> options;
  if (cpu_device_count > 0) {
    PJRT_NamedValue count = option("cpu_device_count", PJRT_NamedValue_kInt64);
    count.int64_value = cpu_device_count;
    // Synchronous: a computation whose inputs are ready runs on the calling thread (the
    // runtime's device executor, which is the device's stream) instead of hopping to the CPU
    // client's thread pool, which costs a wake-up per computation.
    PJRT_NamedValue sync = option("asynchronous", PJRT_NamedValue_kBool);
    sync.bool_value = false;
    options = {count, sync};
  }
  auto create = PW_PJRT_ARGS(PJRT_Client_Create_Args);
  create.create_options = options.data();
  create.num_options = options.size();
  const std::string what = absl::StrCat("creating a client of '", plugin->path(), "'");
  absl::Status created = plugin->Consume(api->PJRT_Client_Create(&create), what);
  if (!created.ok() && options.size() > 1) {
    // A CPU plugin without the "asynchronous" option: its default execution mode.
    create.num_options = 1;
    created = plugin->Consume(api->PJRT_Client_Create(&create), what);
  }
  PW_RETURN_IF_ERROR(created);
  std::unique_ptr<PjrtClient> c(new PjrtClient(plugin, create.client));
  auto devices = PW_PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  devices.client = create.client;
  PW_RETURN_IF_ERROR(
      plugin->Consume(api->PJRT_Client_AddressableDevices(&devices), "listing devices"));
  c->devices_.assign(devices.addressable_devices,
                     devices.addressable_devices + devices.num_addressable_devices);
  for (PJRT_Device* d : c->devices_) {
    auto desc = PW_PJRT_ARGS(PJRT_Device_GetDescription_Args);
    desc.device = d;
    PW_RETURN_IF_ERROR(
        plugin->Consume(api->PJRT_Device_GetDescription(&desc), "describing a device"));
    auto id = PW_PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
    id.device_description = desc.device_description;
    PW_RETURN_IF_ERROR(plugin->Consume(api->PJRT_DeviceDescription_Id(&id), "device id"));
    c->device_ids_.push_back(id.id);
  }
  if (c->devices_.empty())
    return absl::FailedPreconditionError(
        absl::StrCat("PJRT plugin '", plugin->path(), "' has no addressable devices"));
  return c;
}

PjrtClient::~PjrtClient() {
  auto args = PW_PJRT_ARGS(PJRT_Client_Destroy_Args);
  args.client = client_;
  plugin_->Consume(plugin_->api()->PJRT_Client_Destroy(&args), "destroying PJRT client")
      .IgnoreError();
}

std::string PjrtClient::platform_name() const {
  auto args = PW_PJRT_ARGS(PJRT_Client_PlatformName_Args);
  args.client = client_;
  if (!plugin_->Consume(plugin_->api()->PJRT_Client_PlatformName(&args), "platform name").ok())
    return "?";
  return std::string(args.platform_name, args.platform_name_size);
}

namespace {

// Protocol-buffer wire format, for the few xla.CompileOptionsProto fields we set (the .proto
// files are not installed with any package we use; field numbers are XLA's, stable since 2023).
void Varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void VarintField(std::string& out, int field, uint64_t v) {
  Varint(out, static_cast<uint64_t>(field) << 3);
  Varint(out, v);
}
void BytesField(std::string& out, int field, const std::string& bytes) {
  Varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  Varint(out, bytes.size());
  out += bytes;
}

}  // namespace

std::string CompileOptionsBytes(absl::Span<const int64_t> device_ids) {
  // ExecutableBuildOptionsProto: num_replicas = 4, num_partitions = 5, use_spmd_partitioning = 6,
  // device_assignment = 9, use_shardy_partitioner = 19. The plugin aborts on options without a
  // replica count.
  std::string build;
  VarintField(build, 4, 1);
  VarintField(build, 5, device_ids.empty() ? 1 : device_ids.size());
  if (!device_ids.empty()) {
    VarintField(build, 6, 1);
    // DeviceAssignmentProto: replica_count = 1, computation_count = 2, computation_devices = 3
    // (one per partition: ComputationDevice.replica_device_ids = 1, packed).
    std::string assignment;
    VarintField(assignment, 1, 1);
    VarintField(assignment, 2, device_ids.size());
    for (int64_t id : device_ids) {
      std::string ids, computation;
      Varint(ids, static_cast<uint64_t>(id));
      BytesField(computation, 1, ids);
      BytesField(assignment, 3, computation);
    }
    BytesField(build, 9, assignment);
    VarintField(build, 19, 1);  // JAX exports Shardy-annotated modules.
  }
  // CompileOptionsProto: executable_build_options = 3, compile_portable_executable = 4.
  std::string options;
  BytesField(options, 3, build);
  if (device_ids.empty()) VarintField(options, 4, 1);
  return options;
}

absl::StatusOr<std::unique_ptr<PjrtExecutable>> PjrtClient::Compile(
    const std::string& name, absl::string_view stablehlo, std::vector<ArraySpec> inputs,
    absl::Span<const int> partition_devices) const {
  const std::string where = absl::StrCat("compiling function '", name, "'");
  if (stablehlo.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty module"));
  std::vector<int64_t> ids;
  for (int d : partition_devices) {
    if (d < 0 || d >= num_devices())
      return absl::InvalidArgumentError(absl::StrCat(where, ": PJRT device ", d,
                                                     " does not exist (", num_devices(), ")"));
    ids.push_back(device_ids_[d]);
  }
  const PJRT_Api* api = plugin_->api();
  std::string code(stablehlo);
  auto program = PW_PJRT_ARGS(PJRT_Program);
  program.code = code.data();
  program.code_size = code.size();
  static constexpr char kFormat[] = "mlir";
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  const std::string options = CompileOptionsBytes(ids);
  auto args = PW_PJRT_ARGS(PJRT_Client_Compile_Args);
  args.client = client_;
  args.program = &program;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  PW_RETURN_IF_ERROR(plugin_->Consume(api->PJRT_Client_Compile(&args), where));
  auto get = PW_PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = args.executable;
  size_t num_outputs = 0;
  absl::Status s = plugin_->Consume(api->PJRT_LoadedExecutable_GetExecutable(&get), where);
  if (s.ok()) {
    auto outs = PW_PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
    outs.executable = get.executable;
    s = plugin_->Consume(api->PJRT_Executable_NumOutputs(&outs), where);
    num_outputs = outs.num_outputs;
    auto destroy = PW_PJRT_ARGS(PJRT_Executable_Destroy_Args);
    destroy.executable = get.executable;
    plugin_->Consume(api->PJRT_Executable_Destroy(&destroy), where).IgnoreError();
  }
  std::unique_ptr<PjrtExecutable> exe(
      new PjrtExecutable(plugin_, name, args.executable, std::move(inputs), num_outputs, devices_,
                         std::max<int>(1, static_cast<int>(ids.size()))));
  PW_RETURN_IF_ERROR(s);
  return exe;
}

absl::StatusOr<std::shared_ptr<PjrtBuffer>> PjrtClient::BufferFromHost(
    const HostArray& value, int device_index, DeviceId device, const Shape* pjrt_shape) const {
  if (device_index < 0 || device_index >= num_devices())
    return absl::InvalidArgumentError(absl::StrCat("PJRT device ", device_index,
                                                   " does not exist (", num_devices(), ")"));
  if (static_cast<int64_t>(value.bytes.size()) != value.spec.size_bytes())
    return absl::InvalidArgumentError(absl::StrCat("array ", value.spec.ToString(), " needs ",
                                                   value.spec.size_bytes(), " bytes, got ",
                                                   value.bytes.size()));
  ArraySpec pjrt_spec = value.spec;
  if (pjrt_shape != nullptr) {
    if (pjrt_shape->num_elements() != value.spec.num_elements())
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot view ", value.spec.ToString(), " as shape ", pjrt_shape->ToString()));
    pjrt_spec.shape = *pjrt_shape;
  }
  PW_ASSIGN_OR_RETURN(PJRT_Buffer_Type type, ToPjrtType(value.spec.dtype));
  auto args = PW_PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  args.client = client_;
  args.data = value.bytes.data();
  args.type = type;
  args.dims = pjrt_spec.shape.dims().data();
  args.num_dims = pjrt_spec.shape.dims().size();
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  args.device = devices_[device_index];
  PW_RETURN_IF_ERROR(plugin_->Consume(plugin_->api()->PJRT_Client_BufferFromHostBuffer(&args),
                                      "copying an array to a PJRT device"));
  auto buffer = std::make_shared<PjrtBuffer>(plugin_, args.buffer, value.spec, device,
                                             device_index, std::move(pjrt_spec));
  // The host data must stay valid until the transfer is done.
  PW_RETURN_IF_ERROR(plugin_->Await(args.done_with_host_buffer, "copying to device").status());
  return buffer;
}

// ---- Executables

PjrtExecutable::~PjrtExecutable() {
  auto args = PW_PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  args.executable = exe_;
  plugin_->Consume(plugin_->api()->PJRT_LoadedExecutable_Destroy(&args), "destroying executable")
      .IgnoreError();
}

Future<std::vector<std::shared_ptr<PjrtBuffer>>> PjrtExecutable::Execute(
    absl::Span<const std::shared_ptr<PjrtBuffer>> inputs, int device_index, DeviceId device,
    int launch_id, absl::Span<const ArraySpec> output_views) const {
  using Result = Future<std::vector<std::shared_ptr<PjrtBuffer>>>;
  auto launched = Launch(inputs, device_index, device, launch_id, output_views);
  if (!launched.ok()) return Result::Ready(launched.status());
  Promise<std::vector<std::shared_ptr<PjrtBuffer>>> p;
  Result f = p.future();
  launched->computed.OnReady(
      [p = std::move(p), result = std::move(launched->outputs)](const absl::Status& s) mutable {
        if (!s.ok()) return p.Set(s);
        p.Set(std::move(result));
      });
  return f;
}

absl::StatusOr<PjrtExecutable::Launched> PjrtExecutable::Launch(
    absl::Span<const std::shared_ptr<PjrtBuffer>> inputs, int device_index, DeviceId device,
    int launch_id, absl::Span<const ArraySpec> output_views,
    std::optional<PrepareContext> prepare_context) const {
  const std::string where = absl::StrCat("function '", name_, "'");
  if (inputs.size() != inputs_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " takes ", inputs_.size(), " inputs, got ", inputs.size()));
  }
  if (device_index < 0 || device_index >= static_cast<int>(devices_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": PJRT device ", device_index, " does not exist (", devices_.size(), ")"));
  }
  std::vector<PJRT_Buffer*> args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i]->device_index() != device_index) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " input ", i, " is on PJRT device ", inputs[i]->device_index(),
          ", not on device ", device_index));
    }
    if (!(inputs[i]->pjrt_spec() == inputs_[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " input ", i, " expects ", inputs_[i].ToString(), ", got ",
          inputs[i]->pjrt_spec().ToString()));
    }
    args.push_back(inputs[i]->get());
  }
  const PJRT_Api* api = plugin_->api();
  std::vector<PJRT_Buffer*> outputs(num_outputs_, nullptr);
  PJRT_Buffer* const* arg_lists[] = {args.data()};
  PJRT_Buffer** output_lists[] = {outputs.data()};
  PJRT_Event* done[] = {nullptr};
  auto options = PW_PJRT_ARGS(PJRT_ExecuteOptions);
  options.launch_id = launch_id;
  // The execute context, when asked for: destroyed once the computation has run (below).
  auto context = PW_PJRT_ARGS(PJRT_ExecuteContext_Create_Args);
  auto destroy_context = [&] {
    if (context.context == nullptr) return;
    auto destroy = PW_PJRT_ARGS(PJRT_ExecuteContext_Destroy_Args);
    destroy.context = context.context;
    plugin_->Consume(api->PJRT_ExecuteContext_Destroy(&destroy), where).IgnoreError();
  };
  if (prepare_context.has_value()) {
    PW_RETURN_IF_ERROR(plugin_->Consume(api->PJRT_ExecuteContext_Create(&context), where));
    if (absl::Status s = (*prepare_context)(context.context); !s.ok()) {
      destroy_context();
      return Annotate(s, where);
    }
    options.context = context.context;
  }
  auto exec = PW_PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  exec.executable = exe_;
  exec.options = &options;
  exec.argument_lists = arg_lists;
  exec.num_devices = 1;
  exec.num_args = args.size();
  exec.output_lists = output_lists;
  exec.device_complete_events = done;
  exec.execute_device = devices_[device_index];
  absl::Status s = plugin_->Consume(api->PJRT_LoadedExecutable_Execute(&exec), where);
  if (!s.ok()) {
    destroy_context();
    return s;
  }
  Future<> computed = plugin_->Await(done[0], where);
  if (prepare_context.has_value()) {
    // Runs to the end before the context goes (on the CPU plugin it has already: synchronous).
    computed = Future<>::Ready(computed.Await());
    destroy_context();
  }
  if (!output_views.empty() && output_views.size() != num_outputs_) {
    s = absl::InternalError(absl::StrCat(where, ": ", output_views.size(), " output views for ",
                                         num_outputs_, " outputs"));
  }
  // The outputs' specs: asked of the first launch's buffers, then known (shapes are static).
  absl::call_once(output_specs_once_, [&] {
    for (size_t o = 0; o < outputs.size() && output_specs_status_.ok(); ++o) {
      auto type = PW_PJRT_ARGS(PJRT_Buffer_ElementType_Args);
      type.buffer = outputs[o];
      auto dims = PW_PJRT_ARGS(PJRT_Buffer_Dimensions_Args);
      dims.buffer = outputs[o];
      absl::Status ts = plugin_->Consume(api->PJRT_Buffer_ElementType(&type), where);
      if (ts.ok()) ts = plugin_->Consume(api->PJRT_Buffer_Dimensions(&dims), where);
      absl::StatusOr<DType> dtype = ts.ok() ? FromPjrtType(type.type) : absl::StatusOr<DType>(ts);
      if (!dtype.ok()) {
        output_specs_status_ = Annotate(dtype.status(), absl::StrCat(where, " output ", o));
        break;
      }
      output_specs_.push_back(
          {*dtype, Shape(std::vector<int64_t>(dims.dims, dims.dims + dims.num_dims))});
    }
  });
  if (s.ok()) s = output_specs_status_;
  std::vector<std::shared_ptr<PjrtBuffer>> result;
  for (size_t o = 0; o < outputs.size(); ++o) {
    PJRT_Buffer* b = outputs[o];
    ArraySpec spec = s.ok() ? output_specs_[o] : ArraySpec{DType::kInvalid, Shape({})};
    ArraySpec view = spec;
    if (s.ok() && !output_views.empty()) {
      view = output_views[o];
      if (view.dtype != spec.dtype || view.num_elements() != spec.num_elements())
        s = absl::InvalidArgumentError(absl::StrCat(where, " output ", o, " is ", spec.ToString(),
                                                    ", declared ", view.ToString()));
    }
    result.push_back(std::make_shared<PjrtBuffer>(plugin_, b, std::move(view), device,
                                                  device_index, std::move(spec)));
  }
  if (!s.ok()) {
    computed.status().IgnoreError();  // Completes and destroys the event.
    return s;
  }
  return Launched{std::move(result), std::move(computed)};
}

}  // namespace pw::pjrt
