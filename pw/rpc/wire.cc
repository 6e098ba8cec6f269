#include "pw/rpc/wire.h"

#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "pw/base/status_macros.h"

namespace pw::rpc {

uint64_t NewMailId() {
  std::random_device random;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{random()} << 32) ^ random();
  return id;
}

namespace pb = ::google::protobuf;

// Converters of nested messages, overloading the public ones so that the list templates below
// find every FromProto / ToProto by one name.
static absl::StatusOr<NativeOpDef> FromProto(const v1::NativeOp& p);
static absl::StatusOr<ValueRef> FromProto(const v1::ValueRef& p);
static absl::StatusOr<ProgramNode> FromProto(const v1::ProgramNode& p);
static absl::StatusOr<DeviceStatus> FromProto(const v1::DeviceStatus& p);
static void ToProto(const NativeOpDef& op, v1::NativeOp* out);
static void ToProto(const ValueRef& v, v1::ValueRef* out);
static void ToProto(const ProgramNode& n, v1::ProgramNode* out);
static void ToProto(const DeviceStatus& d, v1::DeviceStatus* out);

namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", problem));
}

absl::StatusCode CodeOf(int code) {
  return code >= 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
             ? static_cast<absl::StatusCode>(code)
             : absl::StatusCode::kUnknown;
}

template <typename IdT>
absl::StatusOr<IdT> IdOf(int64_t v, absl::string_view field) {
  if (v < 0) return Invalid(field, absl::StrCat("is negative: ", v));
  return IdT(v);
}

template <typename IdT>
absl::StatusOr<std::vector<IdT>> Ids(const pb::RepeatedField<int64_t>& r, absl::string_view field) {
  std::vector<IdT> out;
  out.reserve(r.size());
  for (int i = 0; i < r.size(); ++i) {
    if (r[i] < 0) {
      return Invalid(absl::StrCat(field, "[", i, "]"), absl::StrCat("is negative: ", r[i]));
    }
    out.emplace_back(r[i]);
  }
  return out;
}

template <typename IdT>
void SetIds(const std::vector<IdT>& ids, pb::RepeatedField<int64_t>* out) {
  out->Clear();
  for (IdT id : ids) out->Add(id.value());
}

// Indices in [0, limit).
absl::StatusOr<std::vector<int>> Indices(const pb::RepeatedField<int32_t>& r,
                                         absl::string_view field, int64_t limit = INT32_MAX) {
  for (int i = 0; i < r.size(); ++i) {
    if (r[i] < 0 || r[i] >= limit) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrCat("is ", r[i], ", not in [0, ", limit, ")"));
    }
  }
  return std::vector<int>(r.begin(), r.end());
}

// A device mesh: positive axes, at most Shape::kMaxRank of them, at most 2^30 devices.
absl::Status CheckMesh(const pb::RepeatedField<int64_t>& mesh, absl::string_view field) {
  if (mesh.size() > Shape::kMaxRank)
    return Invalid(field, absl::StrCat("has ", mesh.size(), " axes, above the limit of ",
                                       Shape::kMaxRank));
  int64_t devices = 1;
  for (int i = 0; i < mesh.size(); ++i) {
    if (mesh[i] <= 0) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrCat("is ", mesh[i], ", not positive"));
    }
    if (__builtin_mul_overflow(devices, mesh[i], &devices) || devices > (int64_t{1} << 30)) {
      return Invalid(field, "has more than 2^30 devices");
    }
  }
  return absl::OkStatus();
}

// A count held in a size_t.
absl::StatusOr<size_t> Count(int64_t v, absl::string_view field) {
  if (v < 0) return Invalid(field, absl::StrCat("is negative: ", v));
  return static_cast<size_t>(v);
}

// Host ids of devices: one per device.
absl::Status CheckHosts(size_t hosts, size_t devices, absl::string_view field) {
  if (hosts == devices) return absl::OkStatus();
  return Invalid(field, absl::StrCat("has ", hosts, " entries for ", devices, " devices"));
}

// The struct a message converts to.
template <typename P>
using StructOf = typename decltype(FromProto(std::declval<const P&>()))::value_type;

template <typename P>
absl::StatusOr<std::vector<StructOf<P>>> List(const pb::RepeatedPtrField<P>& r,
                                              absl::string_view field) {
  std::vector<StructOf<P>> out;
  out.reserve(r.size());
  for (int i = 0; i < r.size(); ++i) {
    auto v = FromProto(r[i]);
    if (!v.ok()) return Annotate(v.status(), absl::StrCat(field, " ", i));
    out.push_back(*std::move(v));
  }
  return out;
}

template <typename T, typename P>
void SetList(const std::vector<T>& v, pb::RepeatedPtrField<P>* out) {
  out->Clear();
  for (const T& x : v) ToProto(x, out->Add());
}

template <typename T>
absl::StatusOr<T> Field(absl::StatusOr<T> v, absl::string_view field) {
  if (!v.ok()) return Annotate(v.status(), field);
  return v;
}

}  // namespace

// ---------------------------------------------------------------- status

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const absl::string_view m = s.message();
  if (m.size() <= kMaxGrpcMessageBytes)
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(m));
  // The head names where it failed, the tail why (the innermost cause).
  const size_t keep = (kMaxGrpcMessageBytes - 64) / 2;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      absl::StrCat(m.substr(0, keep), " ... (", m.size() - 2 * keep,
                                   " bytes of this error left out) ... ",
                                   m.substr(m.size() - keep)));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(CodeOf(s.error_code()), s.error_message());
}

void ToProto(const absl::Status& s, v1::StatusProto* out) {
  out->set_code(static_cast<int32_t>(s.code()));
  out->set_message(std::string(s.message()));
}

absl::Status FromProto(const v1::StatusProto& p) {
  return absl::Status(CodeOf(p.code()), p.message());
}

absl::StatusOr<DispatchMode> DispatchModeFromProto(int32_t mode) {
  if (mode == 0) return DispatchMode::kParallel;
  if (mode == 1) return DispatchMode::kSequential;
  return Invalid("dispatch mode", absl::StrCat(mode, " is unknown"));
}

void ToProto(const RunOptions& o, v1::SubmitRequest* out) {
  out->set_mode(static_cast<int32_t>(o.mode));
  out->set_timeout_us(absl::ToInt64Microseconds(o.timeout));
  out->set_trace_flow(o.trace_flow);
  out->mutable_outputs()->Reserve(static_cast<int>(o.outputs.size()));
  for (BufferId b : o.outputs) out->add_outputs(b.value());
}

absl::StatusOr<RunOptions> RunOptionsFromProto(const v1::SubmitRequest& p) {
  PW_ASSIGN_OR_RETURN(DispatchMode mode, DispatchModeFromProto(p.mode()));
  if (p.timeout_us() < 0)
    return Invalid("submit timeout_us", absl::StrCat(p.timeout_us(), " is negative"));
  RunOptions o(mode);
  o.timeout = absl::Microseconds(p.timeout_us());
  o.trace_flow = p.trace_flow();
  o.outputs.reserve(p.outputs_size());
  for (int64_t b : p.outputs()) o.outputs.push_back(BufferId(b));  // The controller checks them.
  return o;
}

// ---------------------------------------------------------------- bottom layer

void ToProto(const ArraySpec& s, v1::ArraySpec* out) {
  out->set_dtype(static_cast<int32_t>(s.dtype));
  out->mutable_dims()->Assign(s.shape.dims().begin(), s.shape.dims().end());
}

absl::StatusOr<ArraySpec> FromProto(const v1::ArraySpec& p) {
  if (p.dtype() < static_cast<int>(DType::kPred) || p.dtype() > static_cast<int>(DType::kLast)) {
    return Invalid("dtype", absl::StrCat(p.dtype(), " is unknown"));
  }
  ArraySpec s{static_cast<DType>(p.dtype()),
              Shape(std::vector<int64_t>(p.dims().begin(), p.dims().end()))};
  PW_RETURN_IF_ERROR(s.Validate());
  return s;
}

void ToProto(const ShardFile& f, v1::ShardFile* out) {
  out->set_dir(f.dir);
  ToProto(f.global, out->mutable_global());
  out->mutable_chunks()->Assign(f.chunks.dims().begin(), f.chunks.dims().end());
  out->mutable_box_start()->Assign(f.box.start.begin(), f.box.start.end());
  out->mutable_box_limit()->Assign(f.box.limit.begin(), f.box.limit.end());
}

absl::StatusOr<ShardFile> FromProto(const v1::ShardFile& p) {
  ShardFile f;
  f.dir = p.dir();
  if (f.dir.empty()) return Invalid("shard file", "no directory");
  PW_ASSIGN_OR_RETURN(f.global, FromProto(p.global()));
  const int rank = f.global.shape.rank();
  if (p.chunks_size() != rank && p.chunks_size() != 0)
    return Invalid("shard file", "chunks differ in rank from the array");
  for (int64_t c : p.chunks())
    if (c <= 0) return Invalid("shard file", "a chunk extent is not positive");
  f.chunks = Shape(std::vector<int64_t>(p.chunks().begin(), p.chunks().end()));
  if (p.box_start_size() != rank || p.box_limit_size() != rank)
    return Invalid("shard file", "the region differs in rank from the array");
  f.box.start.assign(p.box_start().begin(), p.box_start().end());
  f.box.limit.assign(p.box_limit().begin(), p.box_limit().end());
  for (int d = 0; d < rank; ++d)
    if (f.box.start[d] < 0 || f.box.start[d] > f.box.limit[d] ||
        f.box.limit[d] > f.global.shape.dim(d))
      return Invalid("shard file", "the region is outside the array");
  return f;
}

void ToProto(const Sharding& s, v1::Sharding* out) {
  out->mutable_mesh_shape()->Assign(s.mesh_shape().begin(), s.mesh_shape().end());
  out->mutable_dim_to_axis()->Assign(s.dim_to_axis().begin(), s.dim_to_axis().end());
}

absl::StatusOr<Sharding> FromProto(const v1::Sharding& p) {
  PW_RETURN_IF_ERROR(CheckMesh(p.mesh_shape(), "mesh_shape"));
  for (int d = 0; d < p.dim_to_axis_size(); ++d) {
    const int a = p.dim_to_axis(d);
    if (a < -1 || a >= p.mesh_shape_size()) {
      return Invalid(absl::StrCat("dim_to_axis[", d, "]"),
                     absl::StrCat("is ", a, ", not -1 or a mesh axis below ", p.mesh_shape_size()));
    }
  }
  return Sharding(std::vector<int64_t>(p.mesh_shape().begin(), p.mesh_shape().end()),
                  std::vector<int>(p.dim_to_axis().begin(), p.dim_to_axis().end()));
}

void ToProto(const HostArray& a, v1::HostArray* out) {
  ToProto(a.spec, out->mutable_spec());
  out->set_data(reinterpret_cast<const char*>(a.bytes.data()), a.bytes.size());
}

absl::StatusOr<HostArray> FromProto(v1::HostArray* p) {
  PW_ASSIGN_OR_RETURN(ArraySpec spec, Field(FromProto(p->spec()), "host array spec"));
  if (static_cast<int64_t>(p->data().size()) != spec.size_bytes()) {
    return Invalid("host array data", absl::StrCat("has ", p->data().size(), " bytes but ",
                                                   spec.ToString(), " needs ", spec.size_bytes()));
  }
  HostArray a{std::move(spec), {}};
  a.bytes.assign(p->data().begin(), p->data().end());
  // Freed now, not when the message goes (clear_data keeps the string's capacity).
  std::string().swap(*p->mutable_data());
  return a;
}

// ---------------------------------------------------------------- functions and programs

static void ToProto(const NativeOpDef& op, v1::NativeOp* out) {
  out->set_kernel(op.kernel);
  out->mutable_operands()->Assign(op.operands.begin(), op.operands.end());
  for (const auto& [k, v] : op.attrs) (*out->mutable_attrs())[k] = v;
}

static absl::StatusOr<NativeOpDef> FromProto(const v1::NativeOp& p) {
  NativeOpDef op{p.kernel(), {}, {p.attrs().begin(), p.attrs().end()}};
  PW_ASSIGN_OR_RETURN(op.operands, Indices(p.operands(), "operands"));
  return op;
}

void ToProto(const FunctionDef& d, v1::FunctionDef* out) {
  out->Clear();
  if (const auto* n = std::get_if<NativeFunctionDef>(&d)) {
    v1::NativeFunction* o = out->mutable_native();
    o->set_name(n->name);
    SetList(n->inputs, o->mutable_inputs());
    SetList(n->ops, o->mutable_ops());
    o->mutable_outputs()->Assign(n->outputs.begin(), n->outputs.end());
  } else {
    const auto& s = std::get<StableHloFunctionDef>(d);
    v1::StableHloFunction* o = out->mutable_stablehlo();
    o->set_name(s.name);
    o->set_module(s.module);
    SetList(s.inputs, o->mutable_inputs());
    SetList(s.outputs, o->mutable_outputs());
    o->set_num_partitions(s.num_partitions);
    o->set_collective_axis_size(s.collective_axis_size);
  }
}

absl::StatusOr<FunctionDef> FromProto(const v1::FunctionDef& p) {
  if (p.has_native()) {
    const v1::NativeFunction& n = p.native();
    NativeFunctionDef d{n.name(), {}, {}, {}};
    PW_ASSIGN_OR_RETURN(d.inputs, List(n.inputs(), "native function input"));
    PW_ASSIGN_OR_RETURN(d.ops, List(n.ops(), "native function op"));
    PW_ASSIGN_OR_RETURN(d.outputs, Indices(n.outputs(), "native function outputs"));
    return d;
  }
  if (p.has_stablehlo()) {
    const v1::StableHloFunction& s = p.stablehlo();
    if (s.num_partitions() < 1) {
      return Invalid("stablehlo function num_partitions",
                     absl::StrCat("is ", s.num_partitions(), ", not >= 1"));
    }
    if (s.collective_axis_size() < 0) {
      return Invalid("stablehlo function collective_axis_size",
                     absl::StrCat("is ", s.collective_axis_size(), ", not >= 0"));
    }
    StableHloFunctionDef d{s.name(), s.module(), {}, {}, s.num_partitions(),
                           s.collective_axis_size()};
    PW_ASSIGN_OR_RETURN(d.inputs, List(s.inputs(), "stablehlo function input"));
    PW_ASSIGN_OR_RETURN(d.outputs, List(s.outputs(), "stablehlo function output"));
    return d;
  }
  return Invalid("function def", "has no kind set");
}

static void ToProto(const ValueRef& v, v1::ValueRef* out) {
  out->set_node(v.node);
  out->set_index(v.index);
}

static absl::StatusOr<ValueRef> FromProto(const v1::ValueRef& p) {
  if (p.node() < ValueRef::kArgNode) {
    return Invalid("node", absl::StrCat("is ", p.node(), ", not -1 (an argument) or a node index"));
  }
  if (p.index() < 0) return Invalid("index", absl::StrCat("is negative: ", p.index()));
  return ValueRef{p.node(), p.index()};
}

static void ToProto(const ProgramNode& n, v1::ProgramNode* out) {
  out->set_name(n.name);
  const Binding& b = n.binding;
  v1::Binding* o = out->mutable_binding();
  o->set_function(b.function.value());
  o->set_slice(b.slice.value());
  SetList(b.in_global, o->mutable_in_global());
  SetList(b.in_sharding, o->mutable_in_sharding());
  SetList(b.out_global, o->mutable_out_global());
  SetList(b.out_sharding, o->mutable_out_sharding());
  SetList(n.inputs, out->mutable_inputs());
}

static absl::StatusOr<ProgramNode> FromProto(const v1::ProgramNode& p) {
  ProgramNode n{p.name(), {}, {}};
  const v1::Binding& b = p.binding();
  PW_ASSIGN_OR_RETURN(n.binding.function, IdOf<FunctionId>(b.function(), "binding function"));
  PW_ASSIGN_OR_RETURN(n.binding.slice, IdOf<SliceId>(b.slice(), "binding slice"));
  PW_ASSIGN_OR_RETURN(n.binding.in_global, List(b.in_global(), "binding in_global"));
  PW_ASSIGN_OR_RETURN(n.binding.in_sharding, List(b.in_sharding(), "binding in_sharding"));
  PW_ASSIGN_OR_RETURN(n.binding.out_global, List(b.out_global(), "binding out_global"));
  PW_ASSIGN_OR_RETURN(n.binding.out_sharding, List(b.out_sharding(), "binding out_sharding"));
  PW_ASSIGN_OR_RETURN(n.inputs, List(p.inputs(), "input"));
  return n;
}

void ToProto(const ProgramIr& ir, v1::ProgramIr* out) {
  out->set_name(ir.name);
  SetList(ir.args, out->mutable_args());
  SetList(ir.nodes, out->mutable_nodes());
  SetList(ir.outputs, out->mutable_outputs());
}

absl::StatusOr<ProgramIr> FromProto(const v1::ProgramIr& p) {
  ProgramIr ir{p.name(), {}, {}, {}};
  PW_ASSIGN_OR_RETURN(ir.args, List(p.args(), "ProgramIr arg"));
  PW_ASSIGN_OR_RETURN(ir.nodes, List(p.nodes(), "ProgramIr node"));
  PW_ASSIGN_OR_RETURN(ir.outputs, List(p.outputs(), "ProgramIr output"));
  return ir;
}

// ---------------------------------------------------------------- resource manager

void ToProto(const SliceRequest& r, v1::SliceRequest* out) {
  out->set_num_devices(r.num_devices);
  out->mutable_mesh_shape()->Assign(r.mesh_shape.begin(), r.mesh_shape.end());
  out->set_placement(static_cast<v1::SliceRequest::Placement>(r.placement));
  SetIds(r.islands, out->mutable_islands());
  SetIds(r.hosts, out->mutable_hosts());
  SetIds(r.avoid_islands, out->mutable_avoid_islands());
}

absl::StatusOr<SliceRequest> FromProto(const v1::SliceRequest& p) {
  if (p.num_devices() < 0) {
    return Invalid("slice request num_devices", absl::StrCat("is negative: ", p.num_devices()));
  }
  PW_RETURN_IF_ERROR(CheckMesh(p.mesh_shape(), "slice request mesh_shape"));
  if (!v1::SliceRequest::Placement_IsValid(p.placement())) {
    return Invalid("slice request placement", absl::StrCat("is ", p.placement(),
                                                           ", not island, host or spread"));
  }
  SliceRequest r{p.num_devices(), {p.mesh_shape().begin(), p.mesh_shape().end()},
                 static_cast<SlicePlacement>(p.placement())};
  PW_ASSIGN_OR_RETURN(r.islands, Ids<IslandId>(p.islands(), "slice request islands"));
  PW_ASSIGN_OR_RETURN(r.hosts, Ids<HostId>(p.hosts(), "slice request hosts"));
  PW_ASSIGN_OR_RETURN(r.avoid_islands,
                      Ids<IslandId>(p.avoid_islands(), "slice request avoid_islands"));
  return r;
}

void ToProto(const SliceInfo& s, v1::SliceInfo* out) {
  out->set_id(s.id.value());
  out->set_owner(s.owner.value());
  SetIds(s.devices, out->mutable_devices());
  out->mutable_mesh_shape()->Assign(s.mesh_shape.begin(), s.mesh_shape.end());
  SetIds(s.islands, out->mutable_islands());
  SetIds(s.hosts, out->mutable_hosts());
}

absl::StatusOr<SliceInfo> FromProto(const v1::SliceInfo& p) {
  SliceInfo s;
  PW_ASSIGN_OR_RETURN(s.id, IdOf<SliceId>(p.id(), "slice id"));
  PW_ASSIGN_OR_RETURN(s.owner, IdOf<ClientId>(p.owner(), "slice owner"));
  PW_ASSIGN_OR_RETURN(s.devices, Ids<DeviceId>(p.devices(), "slice devices"));
  PW_ASSIGN_OR_RETURN(s.islands, Ids<IslandId>(p.islands(), "slice islands"));
  PW_ASSIGN_OR_RETURN(s.hosts, Ids<HostId>(p.hosts(), "slice hosts"));
  PW_RETURN_IF_ERROR(CheckHosts(s.hosts.size(), s.devices.size(), "slice hosts"));
  PW_RETURN_IF_ERROR(CheckMesh(p.mesh_shape(), "slice mesh_shape"));
  s.mesh_shape.assign(p.mesh_shape().begin(), p.mesh_shape().end());
  return s;
}

void ToProto(const ArrayInfo& a, v1::ArrayInfo* out) {
  out->set_id(a.id.value());
  ToProto(a.global, out->mutable_global());
  ToProto(a.sharding, out->mutable_sharding());
  out->set_slice(a.slice.value());
  SetIds(a.devices, out->mutable_devices());
  SetIds(a.hosts, out->mutable_hosts());
}

absl::StatusOr<ArrayInfo> FromProto(const v1::ArrayInfo& p) {
  ArrayInfo a;
  PW_ASSIGN_OR_RETURN(a.id, IdOf<BufferId>(p.id(), "array id"));
  PW_ASSIGN_OR_RETURN(a.global, Field(FromProto(p.global()), "array global"));
  PW_ASSIGN_OR_RETURN(a.sharding, Field(FromProto(p.sharding()), "array sharding"));
  PW_ASSIGN_OR_RETURN(a.slice, IdOf<SliceId>(p.slice(), "array slice"));
  PW_ASSIGN_OR_RETURN(a.devices, Ids<DeviceId>(p.devices(), "array devices"));
  PW_ASSIGN_OR_RETURN(a.hosts, Ids<HostId>(p.hosts(), "array hosts"));
  PW_RETURN_IF_ERROR(CheckHosts(a.hosts.size(), a.devices.size(), "array hosts"));
  return a;
}

void ToProto(const FunctionInfo& f, v1::FunctionInfo* out) {
  out->set_id(f.id.value());
  out->set_name(f.name);
  SetList(f.inputs, out->mutable_inputs());
}

absl::StatusOr<FunctionInfo> FromProto(const v1::FunctionInfo& p) {
  FunctionInfo f{FunctionId(), p.name(), {}};
  PW_ASSIGN_OR_RETURN(f.id, IdOf<FunctionId>(p.id(), "function id"));
  PW_ASSIGN_OR_RETURN(f.inputs, List(p.inputs(), "function input"));
  return f;
}

// ---------------------------------------------------------------- host programs

// A host program's slices on the wire: each distinct device list once (nodes name an index).
namespace {
struct SliceTable {
  absl::flat_hash_map<const std::vector<DeviceId>*, int> index;
  v1::HostProgram* out;
  int IndexOf(const SliceDevices& d) {
    auto [it, added] = index.emplace(d.get(), static_cast<int>(index.size()));
    if (added) SetIds(*d, out->add_slices()->mutable_devices());
    return it->second;
  }
};
}  // namespace

static void ToProto(const NodeWork& n, SliceTable& slices, v1::NodeWork* out) {
  out->set_node(n.node);
  out->set_name(n.name);
  if (const auto* c = std::get_if<ComputeWork>(&n.work)) {
    v1::ComputeWork* o = out->mutable_compute();
    o->set_function(c->function.value());
    o->set_slice(slices.IndexOf(c->slice_devices));
    o->mutable_local_ranks()->Assign(c->local_ranks.begin(), c->local_ranks.end());
    o->mutable_inputs()->Assign(c->inputs.begin(), c->inputs.end());
    o->mutable_outputs()->Assign(c->outputs.begin(), c->outputs.end());
    o->mutable_release()->Assign(c->release.begin(), c->release.end());
  } else {
    const auto& t = std::get<TransferWork>(n.work);
    v1::TransferWork* o = out->mutable_transfer();
    o->set_src(t.src);
    o->set_dst(t.dst);
    ToProto(t.global, o->mutable_global());
    ToProto(t.src_sharding, o->mutable_src_sharding());
    SetIds(t.src_devices, o->mutable_src_devices());
    SetIds(t.src_hosts, o->mutable_src_hosts());
    ToProto(t.dst_sharding, o->mutable_dst_sharding());
    SetIds(t.dst_devices, o->mutable_dst_devices());
    o->mutable_local_ranks()->Assign(t.local_ranks.begin(), t.local_ranks.end());
    o->set_link(static_cast<int32_t>(t.link));
  }
}

static absl::StatusOr<ComputeWork> FromProto(const v1::ComputeWork& p,
                                             const std::vector<SliceDevices>& slices) {
  ComputeWork c;
  PW_ASSIGN_OR_RETURN(c.function, IdOf<FunctionId>(p.function(), "function"));
  if (p.slice() < 0 || p.slice() >= static_cast<int64_t>(slices.size()))
    return Invalid("slice", absl::StrCat("is ", p.slice(), ", not in [0, ", slices.size(), ")"));
  c.slice_devices = slices[p.slice()];
  PW_ASSIGN_OR_RETURN(c.local_ranks,
                      Indices(p.local_ranks(), "local_ranks", c.slice_devices->size()));
  PW_ASSIGN_OR_RETURN(c.inputs, Indices(p.inputs(), "inputs"));
  PW_ASSIGN_OR_RETURN(c.outputs, Indices(p.outputs(), "outputs"));
  PW_ASSIGN_OR_RETURN(c.release, Indices(p.release(), "release"));
  return c;
}

// Checks `s` fits `global` and places one shard on each of `devices`.
static absl::Status CheckPlacement(const Sharding& s, const ArraySpec& global, size_t devices,
                                   absl::string_view field) {
  PW_RETURN_IF_ERROR(Annotate(s.Validate(global.shape), field));
  if (static_cast<size_t>(s.num_devices()) != devices) {
    return Invalid(field,
                   absl::StrCat("has ", s.num_devices(), " shards but ", devices, " devices"));
  }
  return absl::OkStatus();
}

static absl::StatusOr<TransferWork> FromProto(const v1::TransferWork& p) {
  TransferWork t;
  if (p.src() < 0 || p.dst() < 0) {
    return Invalid("src/dst", absl::StrCat("is negative: ", p.src(), "/", p.dst()));
  }
  t.src = p.src();
  t.dst = p.dst();
  PW_ASSIGN_OR_RETURN(t.global, Field(FromProto(p.global()), "global"));
  PW_ASSIGN_OR_RETURN(t.src_sharding, Field(FromProto(p.src_sharding()), "src_sharding"));
  PW_ASSIGN_OR_RETURN(t.src_devices, Ids<DeviceId>(p.src_devices(), "src_devices"));
  PW_ASSIGN_OR_RETURN(t.src_hosts, Ids<HostId>(p.src_hosts(), "src_hosts"));
  PW_ASSIGN_OR_RETURN(t.dst_sharding, Field(FromProto(p.dst_sharding()), "dst_sharding"));
  PW_ASSIGN_OR_RETURN(t.dst_devices, Ids<DeviceId>(p.dst_devices(), "dst_devices"));
  PW_ASSIGN_OR_RETURN(t.local_ranks, Indices(p.local_ranks(), "local_ranks", t.dst_devices.size()));
  PW_RETURN_IF_ERROR(CheckHosts(t.src_hosts.size(), t.src_devices.size(), "src_hosts"));
  PW_RETURN_IF_ERROR(
      CheckPlacement(t.src_sharding, t.global, t.src_devices.size(), "src_sharding"));
  PW_RETURN_IF_ERROR(
      CheckPlacement(t.dst_sharding, t.global, t.dst_devices.size(), "dst_sharding"));
  if (p.link() < static_cast<int>(LinkClass::kSameDevice) ||
      p.link() > static_cast<int>(LinkClass::kDcn)) {
    return Invalid("link", absl::StrCat(p.link(), " is unknown"));
  }
  t.link = static_cast<LinkClass>(p.link());
  return t;
}

static absl::StatusOr<NodeWork> FromProto(const v1::NodeWork& p,
                                          const std::vector<SliceDevices>& slices) {
  if (p.node() < 0) return Invalid("node", absl::StrCat("is negative: ", p.node()));
  NodeWork n{p.node(), p.name(), {}};
  if (p.has_compute()) {
    PW_ASSIGN_OR_RETURN(n.work, Field(FromProto(p.compute(), slices), "compute"));
  } else if (p.has_transfer()) {
    PW_ASSIGN_OR_RETURN(n.work, Field(FromProto(p.transfer()), "transfer"));
  } else {
    return Invalid("work", "is not set");
  }
  return n;
}

void ToProto(const HostProgram& h, v1::HostProgram* out) {
  out->set_program(h.program);
  SliceTable slices{{}, out};
  for (const NodeWork& n : h.nodes) ToProto(n, slices, out->add_nodes());
}

absl::StatusOr<HostProgram> FromProto(const v1::HostProgram& p) {
  HostProgram h;  // The id is not part of the body: DispatchRequest carries it.
  h.program = p.program();
  std::vector<SliceDevices> slices;
  for (int i = 0; i < p.slices_size(); ++i) {
    PW_ASSIGN_OR_RETURN(std::vector<DeviceId> d,
                        Ids<DeviceId>(p.slices(i).devices(), absl::StrCat("slices[", i, "]")));
    if (d.empty()) return Invalid(absl::StrCat("slices[", i, "]"), "has no devices");
    slices.push_back(std::make_shared<const std::vector<DeviceId>>(std::move(d)));
  }
  h.nodes.reserve(p.nodes_size());
  for (int i = 0; i < p.nodes_size(); ++i) {
    PW_ASSIGN_OR_RETURN(NodeWork n,
                        Field(FromProto(p.nodes(i), slices), absl::StrCat("HostProgram node ", i)));
    h.nodes.push_back(std::move(n));
  }
  return h;
}

// ---------------------------------------------------------------- status

static void ToProto(const DeviceStatus& d, v1::DeviceStatus* out) {
  out->set_id(d.id.value());
  out->set_host(d.host.value());
  out->set_island(d.island.value());
  out->set_alive(d.alive);
  out->set_memory_capacity(d.memory_capacity);
  out->set_memory_in_use(d.memory_in_use);
  out->set_memory_waiters(static_cast<int64_t>(d.memory_waiters));
  out->set_queue_depth(static_cast<int64_t>(d.queue_depth));
  out->set_executed(d.executed);
  out->set_busy_ns(d.busy_ns);
}

static absl::StatusOr<DeviceStatus> FromProto(const v1::DeviceStatus& p) {
  DeviceStatus d;
  PW_ASSIGN_OR_RETURN(d.id, IdOf<DeviceId>(p.id(), "id"));
  PW_ASSIGN_OR_RETURN(d.host, IdOf<HostId>(p.host(), "host"));
  PW_ASSIGN_OR_RETURN(d.island, IdOf<IslandId>(p.island(), "island"));
  d.alive = p.alive();
  d.memory_capacity = p.memory_capacity();
  d.memory_in_use = p.memory_in_use();
  PW_ASSIGN_OR_RETURN(d.memory_waiters, Count(p.memory_waiters(), "memory_waiters"));
  PW_ASSIGN_OR_RETURN(d.queue_depth, Count(p.queue_depth(), "queue_depth"));
  d.executed = p.executed();
  d.busy_ns = p.busy_ns();
  return d;
}

void ToProto(const HostStatus& h, v1::HostStatus* out) {
  out->set_host(h.host.value());
  out->set_island(h.island.value());
  SetList(h.devices, out->mutable_devices());
  out->set_buffers(static_cast<int64_t>(h.buffers));
  out->set_buffer_bytes(h.buffer_bytes);
  out->set_ici_bytes_received(h.ici_bytes_received);
  out->set_dcn_bytes_received(h.dcn_bytes_received);
  out->set_ici_wire_bytes_received(h.ici_wire_bytes_received);
  out->set_dcn_wire_bytes_received(h.dcn_wire_bytes_received);
  out->set_checkpoint_bytes_saved(h.checkpoint_bytes_saved);
  out->set_checkpoint_bytes_loaded(h.checkpoint_bytes_loaded);
  out->set_commands_received(h.commands_received);
  out->set_command_messages_received(h.command_messages_received);
  out->set_events_sent(h.events_sent);
  out->set_event_messages_sent(h.event_messages_sent);
  out->set_events_mailed(h.events_mailed);
  out->set_dispatch_queue_depth(static_cast<int64_t>(h.dispatch_queue_depth));
  out->set_cancelled_shards(h.cancelled_shards);
  out->set_functions(static_cast<int64_t>(h.functions));
  out->set_executables(static_cast<int64_t>(h.executables));
  out->set_programs(static_cast<int64_t>(h.programs));
  out->set_plans(static_cast<int64_t>(h.plans));
  out->set_compiles(h.compiles);
  out->set_compile_ns(h.compile_ns);
  out->set_executable_hits(h.executable_hits);
  out->set_collectives(h.collectives);
  out->set_collective_ns(h.collective_ns);
  for (const auto& [c, ns] : h.client_device_ns) (*out->mutable_client_device_ns())[c.value()] = ns;
  out->set_error(h.error);
}

absl::StatusOr<HostStatus> FromProto(const v1::HostStatus& p) {
  HostStatus h;
  PW_ASSIGN_OR_RETURN(h.host, IdOf<HostId>(p.host(), "host status host"));
  PW_ASSIGN_OR_RETURN(h.island, IdOf<IslandId>(p.island(), "host status island"));
  PW_ASSIGN_OR_RETURN(h.devices, List(p.devices(), "host status device"));
  PW_ASSIGN_OR_RETURN(h.buffers, Count(p.buffers(), "host status buffers"));
  h.buffer_bytes = p.buffer_bytes();
  h.ici_bytes_received = p.ici_bytes_received();
  h.dcn_bytes_received = p.dcn_bytes_received();
  h.ici_wire_bytes_received = p.ici_wire_bytes_received();
  h.dcn_wire_bytes_received = p.dcn_wire_bytes_received();
  h.checkpoint_bytes_saved = p.checkpoint_bytes_saved();
  h.checkpoint_bytes_loaded = p.checkpoint_bytes_loaded();
  h.commands_received = p.commands_received();
  h.command_messages_received = p.command_messages_received();
  h.events_sent = p.events_sent();
  h.event_messages_sent = p.event_messages_sent();
  h.events_mailed = p.events_mailed();
  PW_ASSIGN_OR_RETURN(h.dispatch_queue_depth,
                      Count(p.dispatch_queue_depth(), "host status dispatch_queue_depth"));
  PW_ASSIGN_OR_RETURN(h.cancelled_shards,
                      Count(p.cancelled_shards(), "host status cancelled_shards"));
  PW_ASSIGN_OR_RETURN(h.functions, Count(p.functions(), "host status functions"));
  PW_ASSIGN_OR_RETURN(h.executables, Count(p.executables(), "host status executables"));
  PW_ASSIGN_OR_RETURN(h.programs, Count(p.programs(), "host status programs"));
  PW_ASSIGN_OR_RETURN(h.plans, Count(p.plans(), "host status plans"));
  h.compiles = p.compiles();
  h.compile_ns = p.compile_ns();
  h.executable_hits = p.executable_hits();
  h.collectives = p.collectives();
  h.collective_ns = p.collective_ns();
  for (const auto& [c, ns] : p.client_device_ns()) h.client_device_ns.emplace_back(ClientId(c), ns);
  std::sort(h.client_device_ns.begin(), h.client_device_ns.end());
  h.error = p.error();
  return h;
}

void ToProto(const ClusterStatus& c, v1::ClusterStatus* out) {
  SetList(c.hosts, out->mutable_hosts());
  out->set_logical_buffers(static_cast<int64_t>(c.logical_buffers));
  out->set_runs_in_flight(static_cast<int64_t>(c.runs_in_flight));
  out->set_runs_completed(c.runs_completed);
  out->mutable_scheduler_queue_depth()->Assign(c.scheduler_queue_depth.begin(),
                                               c.scheduler_queue_depth.end());
  out->mutable_scheduler_round_trip_ns()->Assign(c.scheduler_round_trip_ns.begin(),
                                                 c.scheduler_round_trip_ns.end());
  for (const auto& r : c.running) {
    v1::RunningProgram* o = out->add_running();
    o->set_run(r.run.value());
    o->set_client(r.client.value());
    o->set_program(r.program);
  }
  out->set_scheduling(c.scheduling);
  for (const ClusterStatus::Tenant& t : c.tenants) {
    v1::TenantStatus* o = out->add_tenants();
    o->set_name(t.name);
    o->set_share(t.share);
    o->set_pinned(t.pinned);
    o->set_memory_quota_bytes(t.memory_quota_bytes);
    o->set_memory_bytes(t.memory_bytes);
    o->set_clients(t.clients);
    o->set_queued(t.queued);
    o->set_achieved_share(t.achieved_share);
    o->set_device_seconds(t.device_seconds);
  }
}

absl::StatusOr<ClusterStatus> FromProto(const v1::ClusterStatus& p) {
  ClusterStatus c;
  PW_ASSIGN_OR_RETURN(c.hosts, List(p.hosts(), "cluster status host"));
  PW_ASSIGN_OR_RETURN(c.logical_buffers,
                      Count(p.logical_buffers(), "cluster status logical_buffers"));
  PW_ASSIGN_OR_RETURN(c.runs_in_flight, Count(p.runs_in_flight(), "cluster status runs_in_flight"));
  c.runs_completed = p.runs_completed();
  for (int i = 0; i < p.scheduler_queue_depth_size(); ++i) {
    PW_ASSIGN_OR_RETURN(size_t depth, Count(p.scheduler_queue_depth(i),
                                            absl::StrCat("scheduler_queue_depth[", i, "]")));
    c.scheduler_queue_depth.push_back(depth);
  }
  for (int i = 0; i < p.scheduler_round_trip_ns_size(); ++i) {
    PW_ASSIGN_OR_RETURN(size_t ns, Count(p.scheduler_round_trip_ns(i),
                                         absl::StrCat("scheduler_round_trip_ns[", i, "]")));
    c.scheduler_round_trip_ns.push_back(static_cast<int64_t>(ns));
  }
  for (const v1::RunningProgram& r : p.running()) {
    PW_ASSIGN_OR_RETURN(RunId run, IdOf<RunId>(r.run(), "running run"));
    PW_ASSIGN_OR_RETURN(ClientId client, IdOf<ClientId>(r.client(), "running client"));
    c.running.push_back({run, client, r.program()});
  }
  c.scheduling = p.scheduling();
  for (const v1::TenantStatus& t : p.tenants())
    c.tenants.push_back({t.name(), t.share(), t.pinned(), t.memory_quota_bytes(), t.memory_bytes(),
                         t.clients(), t.queued(), t.achieved_share(), t.device_seconds()});
  return c;
}

void ToProto(const trace::Chunk& c, v1::TraceChunk* out) {
  out->mutable_events()->Reserve(static_cast<int>(c.events.size()));
  for (const trace::Event& e : c.events) {
    v1::TraceEvent* p = out->add_events();
    p->set_phase(e.phase);
    p->set_track_kind(static_cast<int32_t>(e.track.kind));
    p->set_track_id(e.track.id);
    p->set_track_host(e.track.host);
    p->set_name(e.name);
    p->set_category(e.category);
    p->set_ts_ns(e.ts_ns);
    p->set_dur_ns(e.dur_ns);
    p->set_flow(e.flow);
    p->set_client(e.client);
    for (const auto& [k, v] : e.args) {
      v1::TraceArg* a = p->add_args();
      a->set_key(k);
      if (std::holds_alternative<int64_t>(v)) a->set_int_value(std::get<int64_t>(v));
      else a->set_string_value(std::get<std::string>(v));
    }
  }
  for (uint64_t id : c.processes) out->add_processes(id);
  out->set_dropped(c.dropped);
  out->set_clock_ns(c.clock);
}

absl::StatusOr<trace::Chunk> FromProto(const v1::TraceChunk& p) {
  trace::Chunk c;
  c.events.reserve(p.events_size());
  for (int i = 0; i < p.events_size(); ++i) {
    const v1::TraceEvent& e = p.events(i);
    if (e.phase() != 'X' && e.phase() != 's' && e.phase() != 'f' && e.phase() != 'i')
      return absl::InvalidArgumentError(absl::StrCat("trace event ", i, ": phase ", e.phase()));
    if (e.track_kind() < 0 || e.track_kind() > static_cast<int32_t>(trace::Track::Kind::kCompile))
      return absl::InvalidArgumentError(
          absl::StrCat("trace event ", i, ": track kind ", e.track_kind()));
    if (e.dur_ns() < 0)
      return absl::InvalidArgumentError(absl::StrCat("trace event ", i, ": negative duration"));
    trace::Event out;
    out.phase = static_cast<char>(e.phase());
    out.track = {static_cast<trace::Track::Kind>(e.track_kind()), e.track_id(), e.track_host()};
    out.name = e.name();
    out.category = e.category();
    out.ts_ns = e.ts_ns();
    out.dur_ns = e.dur_ns();
    out.flow = e.flow();
    out.client = e.client();
    for (const v1::TraceArg& a : e.args()) {
      if (a.value_case() == v1::TraceArg::kIntValue) out.args.emplace_back(a.key(), a.int_value());
      else out.args.emplace_back(a.key(), a.string_value());
    }
    c.events.push_back(std::move(out));
  }
  c.processes.assign(p.processes().begin(), p.processes().end());
  c.dropped = p.dropped();
  c.clock = p.clock_ns();
  return c;
}

}  // namespace pw::rpc
