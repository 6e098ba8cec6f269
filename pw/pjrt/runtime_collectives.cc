#include "pw/trace/trace.h"
#include "pw/pjrt/runtime_collectives.h"

#include <algorithm>
#include <complex>
#include <cstring>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pw/base/status_macros.h"
#include "xla/ffi/api/ffi.h"  // From the installed jaxlib wheel (see CMakeLists.txt).

namespace pw::pjrt {

namespace ffi = xla::ffi;

// ---- The plugin's FFI extension, version 3 (declared here: no installed header has it).

namespace {

struct FfiTypeInfo {
  void (*deleter)(void*);
  void (*serialize)();
  void (*deserialize)();
};
struct FfiTypeRegisterArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* type_name;
  size_t type_name_size;
  int64_t type_id;  // In-out: 0 asks the plugin to assign one.
  FfiTypeInfo* type_info;
};
struct FfiUserData {
  int64_t type_id;
  void* data;
};
struct FfiUserDataAddArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_ExecuteContext* context;
  FfiUserData user_data;
};
struct FfiRegisterHandlerArgs {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;  // XLA_FFI_Handler*.
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
};
struct FfiExtension {
  PJRT_Extension_Base base;
  PJRT_Error* (*type_register)(FfiTypeRegisterArgs*);
  PJRT_Error* (*user_data_add)(FfiUserDataAddArgs*);
  PJRT_Error* (*register_handler)(FfiRegisterHandlerArgs*);
};

const FfiExtension* FindFfiExtension(const PJRT_Api* api) {
  for (const PJRT_Extension_Base* e = api->extension_start; e != nullptr; e = e->next) {
    // Read as an integer: a newer plugin has extension types our header's enum lacks.
    static_assert(sizeof(PJRT_Extension_Type) == sizeof(int));
    int type;
    std::memcpy(&type, &e->type, sizeof(type));
    if (type == static_cast<int>(PJRT_Extension_Type_FFI))
      return reinterpret_cast<const FfiExtension*>(e);
  }
  return nullptr;
}

// The user-data type the handlers decode: its pointer is a CollectiveLaunch*.
struct LaunchData {
  static ffi::TypeId id;
};
ffi::TypeId LaunchData::id = {0};

CollectiveLaunch* LaunchOf(LaunchData* data) { return reinterpret_cast<CollectiveLaunch*>(data); }

ffi::Error ToFfi(const absl::Status& s) {
  if (s.ok()) return ffi::Error::Success();
  return ffi::Error(static_cast<XLA_FFI_Error_Code>(s.code()), std::string(s.message()));
}

// ---- Reductions, by element type.

template <typename T>
void ReduceTyped(Reduction r, absl::Span<const void* const> in, size_t offset, size_t count,
                 void* out_bytes) {
  T* out = static_cast<T*>(out_bytes);
  const T* first = static_cast<const T*>(in[0]) + offset;
  if (first != out) std::copy(first, first + count, out);
  for (size_t i = 1; i < in.size(); ++i) {
    const T* x = static_cast<const T*>(in[i]) + offset;
    switch (r) {
      case Reduction::kSum:
        for (size_t k = 0; k < count; ++k) out[k] += x[k];
        break;
      case Reduction::kMax:
        for (size_t k = 0; k < count; ++k) out[k] = std::max(out[k], x[k]);
        break;
      case Reduction::kMin:
        for (size_t k = 0; k < count; ++k) out[k] = std::min(out[k], x[k]);
        break;
    }
  }
}

// Reduces elements [offset, offset + count) of every input into `out`. f16 and bf16 are widened
// to f32 by the module before it reaches here.
absl::Status Reduce(ffi::DataType type, Reduction r, absl::Span<const void* const> in,
                    size_t offset, size_t count, void* out) {
  using D = ffi::DataType;
  switch (type) {
    case D::F32: ReduceTyped<float>(r, in, offset, count, out); break;
    case D::F64: ReduceTyped<double>(r, in, offset, count, out); break;
    case D::S8: ReduceTyped<int8_t>(r, in, offset, count, out); break;
    case D::S16: ReduceTyped<int16_t>(r, in, offset, count, out); break;
    case D::S32: ReduceTyped<int32_t>(r, in, offset, count, out); break;
    case D::S64: ReduceTyped<int64_t>(r, in, offset, count, out); break;
    case D::U8: ReduceTyped<uint8_t>(r, in, offset, count, out); break;
    case D::U16: ReduceTyped<uint16_t>(r, in, offset, count, out); break;
    case D::U32: ReduceTyped<uint32_t>(r, in, offset, count, out); break;
    case D::U64: ReduceTyped<uint64_t>(r, in, offset, count, out); break;
    case D::PRED:  // Sum of booleans is "any".
      ReduceTyped<uint8_t>(r == Reduction::kSum ? Reduction::kMax : r, in, offset, count, out);
      break;
    case D::C64:
    case D::C128:
      if (r != Reduction::kSum)
        return absl::InvalidArgumentError("complex values have no max or min reduction");
      if (type == D::C64) ReduceTyped<float>(r, in, 2 * offset, 2 * count, out);
      else ReduceTyped<double>(r, in, 2 * offset, 2 * count, out);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "element type ", static_cast<int>(type), " has no reduction in runtime collectives"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Reduction> ReductionOf(int64_t r) {
  if (r < 0 || r > static_cast<int64_t>(Reduction::kMin))
    return absl::InvalidArgumentError(absl::StrCat("unknown reduction ", r));
  return static_cast<Reduction>(r);
}

using Group = CollectiveLaunch::Group;

// This shard's group in a collective whose call names `groups`/`group_size`
// (CollectiveLaunch::GroupOf); an error says which collective it was.
absl::StatusOr<Group> GroupIn(CollectiveLaunch* launch, ffi::Span<const int64_t> groups,
                              int64_t group_size, absl::string_view kind) {
  if (launch == nullptr || launch->collectives() == nullptr)
    return absl::FailedPreconditionError(absl::StrCat(
        kind, ": this computation was launched without the runtime's collectives"));
  absl::StatusOr<Group> group = launch->GroupOf(
      absl::MakeConstSpan(groups.size() == 0 ? nullptr : &groups.front(), groups.size()),
      group_size);
  if (!group.ok()) return Annotate(group.status(), kind);
  return group;
}

// Runs the next invocation of collective `op_id` of `launch` in this shard's `group`:
// run(collectives, key). A failure says which collective it was and where.
template <typename F>
absl::Status InLaunch(CollectiveLaunch* launch, const Group& group, int64_t op_id,
                      absl::string_view kind, const F& run) {
  const CollectiveKey key = launch->NextKey(op_id, group.index);
  trace::Span span(trace::DeviceTrack(launch->devices()[launch->rank()]), "collective", kind);
  span.Arg("run", key.run).Arg("op", static_cast<int64_t>(key.op))
      .Arg("ranks", static_cast<int64_t>(group.size()));
  const int64_t t0 = Collectives::Timed() ? trace::Now() : 0;
  absl::Status s = run(*launch->collectives(), key);
  launch->collectives()->Count(t0 == 0 ? 0 : trace::Now() - t0);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(kind, " (", launch->Where(key), "): ",
                                               s.message()));
  }
  return s;
}

// Runs one collective of `launch` with this shard's `in`/`out`; `combine` gets every rank's of
// the group.
absl::Status RunCollective(CollectiveLaunch* launch, const Group& group, int64_t op_id,
                           absl::string_view kind, const void* in, size_t in_bytes, void* out,
                           size_t out_bytes, const Collectives::Combine& combine) {
  return InLaunch(launch, group, op_id, kind, [&](Collectives& c, const CollectiveKey& key) {
    return c.Run(key, group.devices, group.rank, in, in_bytes, out, out_bytes, combine);
  });
}

absl::Status CheckBytes(absl::string_view kind, size_t got, size_t want) {
  if (got == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kind, ": output has ", got, " bytes, expected ", want));
}

// ---- Handlers.

ffi::Error AllReduce(LaunchData* data, ffi::AnyBuffer x, ffi::AnyBuffer /*after*/,
                     ffi::Result<ffi::AnyBuffer> y, int64_t op_id,
                     ffi::Span<const int64_t> groups, int64_t group_size, int64_t reduction) {
  absl::StatusOr<Reduction> r = ReductionOf(reduction);
  if (!r.ok()) return ToFfi(r.status());
  if (absl::Status s = CheckBytes("all_reduce", y->size_bytes(), x.size_bytes()); !s.ok())
    return ToFfi(s);
  CollectiveLaunch* launch = LaunchOf(data);
  absl::StatusOr<Group> g = GroupIn(launch, groups, group_size, "all_reduce");
  if (!g.ok()) return ToFfi(g.status());
  const ffi::DataType type = x.element_type();
  const size_t count = x.element_count(), bytes = x.size_bytes();
  if (count == 0) return ffi::Error::Success();
  const size_t element = bytes / count;
  // Checked once here, so the reduction below (run per chunk, maybe on a receiving thread)
  // cannot fail.
  const void* probe[1] = {x.untyped_data()};
  if (absl::Status s = Reduce(type, *r, probe, 0, 0, y->untyped_data()); !s.ok()) return ToFfi(s);
  auto reduce = [type, r = *r, element](void* acc, const void* in, size_t n) {
    const void* both[2] = {acc, in};
    Reduce(type, r, both, 0, n / element, acc).IgnoreError();
  };
  return ToFfi(InLaunch(launch, *g, op_id, "all_reduce", [&](Collectives& c, const CollectiveKey& key) {
    return c.AllReduce(key, g->devices, g->rank, x.untyped_data(), y->untyped_data(), bytes,
                       element, reduce);
  }));
}

ffi::Error AllGather(LaunchData* data, ffi::AnyBuffer x, ffi::AnyBuffer /*after*/,
                     ffi::Result<ffi::AnyBuffer> y, int64_t op_id,
                     ffi::Span<const int64_t> groups, int64_t group_size) {
  CollectiveLaunch* launch = LaunchOf(data);
  absl::StatusOr<Group> g = GroupIn(launch, groups, group_size, "all_gather");
  if (!g.ok()) return ToFfi(g.status());
  const size_t bytes = x.size_bytes(), n = g->size();
  if (absl::Status s = CheckBytes("all_gather", y->size_bytes(), n * bytes); !s.ok())
    return ToFfi(s);
  auto combine = [&](absl::Span<const void* const> in, absl::Span<void* const> out) {
    for (size_t i = 0; i < out.size(); ++i) {
      for (size_t j = 0; j < in.size(); ++j)
        std::memcpy(static_cast<char*>(out[i]) + j * bytes, in[j], bytes);
    }
    return absl::OkStatus();
  };
  return ToFfi(RunCollective(launch, *g, op_id, "all_gather", x.untyped_data(), bytes,
                             y->untyped_data(), n * bytes, combine));
}

ffi::Error ReduceScatter(LaunchData* data, ffi::AnyBuffer x, ffi::AnyBuffer /*after*/,
                         ffi::Result<ffi::AnyBuffer> y, int64_t op_id,
                         ffi::Span<const int64_t> groups, int64_t group_size, int64_t reduction) {
  absl::StatusOr<Reduction> r = ReductionOf(reduction);
  if (!r.ok()) return ToFfi(r.status());
  CollectiveLaunch* launch = LaunchOf(data);
  absl::StatusOr<Group> g = GroupIn(launch, groups, group_size, "reduce_scatter");
  if (!g.ok()) return ToFfi(g.status());
  const size_t n = g->size();
  const size_t bytes = x.size_bytes(), count = x.element_count() / n;
  if (x.element_count() % n != 0 || y->element_count() != count) {
    return ToFfi(absl::InvalidArgumentError(absl::StrCat(
        "reduce_scatter: input of ", x.element_count(), " elements over ", n,
        " ranks, output of ", y->element_count())));
  }
  const ffi::DataType type = x.element_type();
  auto combine = [&](absl::Span<const void* const> in, absl::Span<void* const> out) {
    absl::Status s;
    for (size_t j = 0; s.ok() && j < out.size(); ++j)
      s = Reduce(type, *r, in, j * count, count, out[j]);
    return s;
  };
  return ToFfi(RunCollective(launch, *g, op_id, "reduce_scatter", x.untyped_data(), bytes,
                             y->untyped_data(), y->size_bytes(), combine));
}

ffi::Error AllToAll(LaunchData* data, ffi::AnyBuffer x, ffi::AnyBuffer /*after*/,
                    ffi::Result<ffi::AnyBuffer> y, int64_t op_id,
                    ffi::Span<const int64_t> groups, int64_t group_size) {
  CollectiveLaunch* launch = LaunchOf(data);
  absl::StatusOr<Group> g = GroupIn(launch, groups, group_size, "all_to_all");
  if (!g.ok()) return ToFfi(g.status());
  const size_t n = g->size();
  const size_t bytes = x.size_bytes(), chunk = bytes / n;
  if (bytes % n != 0) {
    return ToFfi(absl::InvalidArgumentError(
        absl::StrCat("all_to_all: input of ", bytes, " bytes does not split over ", n, " ranks")));
  }
  if (absl::Status s = CheckBytes("all_to_all", y->size_bytes(), bytes); !s.ok()) return ToFfi(s);
  auto combine = [&](absl::Span<const void* const> in, absl::Span<void* const> out) {
    for (size_t j = 0; j < out.size(); ++j) {
      for (size_t i = 0; i < in.size(); ++i)
        std::memcpy(static_cast<char*>(out[j]) + i * chunk,
                    static_cast<const char*>(in[i]) + j * chunk, chunk);
    }
    return absl::OkStatus();
  };
  return ToFfi(RunCollective(launch, *g, op_id, "all_to_all", x.untyped_data(), bytes,
                             y->untyped_data(), bytes, combine));
}

ffi::Error Ppermute(LaunchData* data, ffi::AnyBuffer x, ffi::AnyBuffer /*after*/,
                    ffi::Result<ffi::AnyBuffer> y, int64_t op_id,
                    ffi::Span<const int64_t> groups, int64_t group_size,
                    ffi::Span<const int64_t> pairs) {
  CollectiveLaunch* launch = LaunchOf(data);
  absl::StatusOr<Group> g = GroupIn(launch, groups, group_size, "ppermute");
  if (!g.ok()) return ToFfi(g.status());
  const int64_t n = g->size();
  const size_t bytes = x.size_bytes();
  if (absl::Status s = CheckBytes("ppermute", y->size_bytes(), bytes); !s.ok()) return ToFfi(s);
  if (pairs.size() % 2 != 0)
    return ToFfi(absl::InvalidArgumentError("ppermute: pairs must be (source, destination)"));
  for (int64_t p : pairs) {
    if (p < 0 || p >= n) {
      return ToFfi(absl::InvalidArgumentError(
          absl::StrCat("ppermute: rank ", p, " is outside the group of ", n)));
    }
  }
  auto combine = [&](absl::Span<const void* const> in, absl::Span<void* const> out) {
    for (void* o : out) std::memset(o, 0, bytes);
    for (size_t k = 0; k + 1 < pairs.size(); k += 2)
      std::memcpy(out[pairs[k + 1]], in[pairs[k]], bytes);
    return absl::OkStatus();
  };
  return ToFfi(RunCollective(launch, *g, op_id, "ppermute", x.untyped_data(), bytes,
                             y->untyped_data(), bytes, combine));
}

// pw_after: y = x, once `after` is written (orders a loop holding collectives after the
// collectives before it).
ffi::Error After(ffi::AnyBuffer x, ffi::AnyBuffer /*after*/, ffi::Result<ffi::AnyBuffer> y) {
  if (absl::Status s = CheckBytes("after", y->size_bytes(), x.size_bytes()); !s.ok())
    return ToFfi(s);
  if (x.size_bytes() > 0) std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  return ffi::Error::Success();
}

ffi::Error AxisIndex(LaunchData* data, ffi::Result<ffi::AnyBuffer> y,
                     ffi::Span<const int64_t> groups, int64_t group_size) {
  if (y->element_type() != ffi::DataType::S32 || y->element_count() != 1)
    return ToFfi(absl::InvalidArgumentError("axis_index: output must be s32[]"));
  absl::StatusOr<Group> g = GroupIn(LaunchOf(data), groups, group_size, "axis_index");
  if (!g.ok()) return ToFfi(g.status());
  *static_cast<int32_t*>(y->untyped_data()) = g->rank;
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kAllReduce, AllReduce,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::UserData<LaunchData>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()  // after: orders the collectives.
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("op_id")
                           .Attr<ffi::Span<const int64_t>>("groups")
                           .Attr<int64_t>("group_size")
                           .Attr<int64_t>("reduction"));
XLA_FFI_DEFINE_HANDLER(kAllGather, AllGather,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::UserData<LaunchData>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()  // after: orders the collectives.
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("op_id")
                           .Attr<ffi::Span<const int64_t>>("groups")
                           .Attr<int64_t>("group_size"));
XLA_FFI_DEFINE_HANDLER(kReduceScatter, ReduceScatter,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::UserData<LaunchData>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()  // after: orders the collectives.
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("op_id")
                           .Attr<ffi::Span<const int64_t>>("groups")
                           .Attr<int64_t>("group_size")
                           .Attr<int64_t>("reduction"));
XLA_FFI_DEFINE_HANDLER(kAllToAll, AllToAll,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::UserData<LaunchData>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()  // after: orders the collectives.
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("op_id")
                           .Attr<ffi::Span<const int64_t>>("groups")
                           .Attr<int64_t>("group_size"));
XLA_FFI_DEFINE_HANDLER(kPpermute, Ppermute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::UserData<LaunchData>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()  // after: orders the collectives.
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("op_id")
                           .Attr<ffi::Span<const int64_t>>("groups")
                           .Attr<int64_t>("group_size")
                           .Attr<ffi::Span<const int64_t>>("pairs"));
XLA_FFI_DEFINE_HANDLER(kAfter, After,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER(kAxisIndex, AxisIndex,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::UserData<LaunchData>>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<ffi::Span<const int64_t>>("groups")
                           .Attr<int64_t>("group_size"));

absl::StatusOr<CollectiveLaunch::Group> CollectiveLaunch::GroupOf(
    absl::Span<const int64_t> groups, int64_t group_size) const {
  const int64_t n = size();
  if (group_size <= 0 || n % group_size != 0 || static_cast<int64_t>(groups.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "groups of ", group_size, " over ", groups.size(), " ranks do not split the launch's ", n,
        " ranks"));
  }
  Group group;
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = groups[i];
    if (r < 0 || r >= n || seen[r]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "groups: rank ", r, " at position ", i, " is ", r < 0 || r >= n ? "outside" : "twice in",
          " the launch's ", n, " ranks"));
    }
    seen[r] = true;
    if (r == rank_) {
      group.index = static_cast<int>(i / group_size);
      group.rank = static_cast<int>(i % group_size);
    }
  }
  group.devices.reserve(group_size);
  for (int64_t i = 0; i < group_size; ++i)
    group.devices.push_back(devices_[groups[group.index * group_size + i]]);
  return group;
}

CollectiveKey CollectiveLaunch::NextKey(int64_t op_id, int group) {
  int32_t invocation;
  {
    pw::MutexLock lock(&mu_);
    invocation = invocations_[op_id]++;
  }
  CollectiveKey key = key_;
  key.op = static_cast<int32_t>(((op_id & 0x7ff) << 20) | (invocation & 0xfffff));
  key.group = group;
  return key;
}

std::string CollectiveLaunch::Where(const CollectiveKey& key) const {
  return absl::StrCat("run:", key.run, " node ", key.node, " op ", key.op >> 20, " on rank ",
                      rank_, " of ", devices_.size(), key.group > 0 ? absl::StrCat(
                      " (group ", key.group, ")") : "");
}

absl::Status RegisterRuntimeCollectives(const PjrtPlugin& plugin, absl::string_view platform) {
  // Plugins are never unloaded (pjrt_plugin.h), so neither is what they were told.
  static pw::Mutex* const mu = new pw::Mutex;
  static auto* const done = new absl::flat_hash_map<const PJRT_Api*, absl::Status>;
  pw::MutexLock lock(mu);
  if (auto it = done->find(plugin.api()); it != done->end()) return it->second;
  absl::Status& status = (*done)[plugin.api()];
  const FfiExtension* ext = FindFfiExtension(plugin.api());
  if (ext == nullptr || ext->base.struct_size < sizeof(FfiExtension)) {
    status = absl::FailedPreconditionError(absl::StrCat(
        "PJRT plugin '", plugin.path(), "' has no FFI extension",
        ext == nullptr ? "" : absl::StrCat(" of at least ", sizeof(FfiExtension), " bytes"),
        ": collectives of XLA functions need it to run through the runtime"));
    return status;
  }
  static constexpr absl::string_view kTypeName = "pathways.CollectiveLaunch";
  FfiTypeInfo info{};
  FfiTypeRegisterArgs type{sizeof(FfiTypeRegisterArgs), nullptr, kTypeName.data(),
                           kTypeName.size(), 0, &info};
  status = plugin.Consume(ext->type_register(&type), "registering the runtime collectives' type");
  if (!status.ok()) return status;
  LaunchData::id.type_id = type.type_id;
  const std::pair<absl::string_view, XLA_FFI_Handler*> handlers[] = {
      {"pw_all_reduce", kAllReduce},       {"pw_all_gather", kAllGather},
      {"pw_reduce_scatter", kReduceScatter}, {"pw_all_to_all", kAllToAll},
      {"pw_ppermute", kPpermute},          {"pw_axis_index", kAxisIndex},
      {"pw_after", kAfter}};
  for (const auto& [name, handler] : handlers) {
    FfiRegisterHandlerArgs args{sizeof(FfiRegisterHandlerArgs), name.data(), name.size(),
                                reinterpret_cast<void*>(handler), platform.data(),
                                platform.size(), 0};
    status = plugin.Consume(ext->register_handler(&args),
                            absl::StrCat("registering FFI handler ", name));
    if (!status.ok()) return status;
  }
  return status;
}

absl::Status AddCollectiveLaunch(const PjrtPlugin& plugin, PJRT_ExecuteContext* context,
                                 CollectiveLaunch* launch) {
  const FfiExtension* ext = FindFfiExtension(plugin.api());
  if (ext == nullptr || LaunchData::id.type_id == 0)
    return absl::FailedPreconditionError("runtime collectives are not registered");
  FfiUserDataAddArgs args{sizeof(FfiUserDataAddArgs), nullptr, context,
                          {LaunchData::id.type_id, launch}};
  return plugin.Consume(ext->user_data_add(&args), "adding a launch's collectives");
}

}  // namespace pw::pjrt
