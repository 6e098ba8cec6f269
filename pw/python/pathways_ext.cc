// _pathways: the Python extension behind the `pathways` package (nanobind).
//
// A thin layer over the C++ client (pw/client) and the embedded cluster: statuses become Python
// pathways.errors exceptions (RuntimeErrors, one class per status code) carrying the Status
// message; numpy arrays convert to and from HostArrays. Calls that may block (RPCs, waits,
// compiles) release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "pw/client/client.h"
#include "pw/embedded/embedded_cluster.h"
#include "pw/pjrt/pjrt_plugin.h"
#include "pw/rpc/remote_controller.h"
#include "pw/rpc/wire.h"
#include "pw/server/local_cluster.h"
#include "pw/server/status_json.h"
#include "pw/trace/trace_json.h"

namespace nb = nanobind;

namespace pw {
namespace {

// A non-OK status on its way to Python, where it becomes pathways.errors.<its code> (see the
// translator registered in the module).
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status s) : status_(std::move(s)), what_(status_.ToString()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  std::string what_;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  Check(v.status());
  return *std::move(v);
}

ArraySpec SpecOf(const std::string& dtype, const std::vector<int64_t>& shape) {
  return ArraySpec{Unwrap(DTypeFromName(dtype)), Shape(shape)};
}

// An array's bytes as Python hands them over: a flat uint8 view of a C-contiguous numpy array
// of any dtype (bfloat16 and complex64 included: numpy cannot export those by DLPack), read-only
// ones too. The dtype and shape come beside it (pathways/__init__.py: _raw).
using RawBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The spec of `raw`'s array, checked against its size.
ArraySpec CheckedSpec(const RawBytes& raw, const std::string& dtype,
                      const std::vector<int64_t>& shape) {
  ArraySpec spec = SpecOf(dtype, shape);
  Check(spec.Validate());
  if (static_cast<int64_t>(raw.size()) != spec.size_bytes())
    throw std::invalid_argument(absl::StrCat("an array ", spec.ToString(), " has ",
                                             spec.size_bytes(), " bytes, got ", raw.size()));
  return spec;
}

HostArray ToHostArray(const RawBytes& raw, const std::string& dtype,
                      const std::vector<int64_t>& shape) {
  HostArray h{CheckedSpec(raw, dtype, shape), {}};
  h.bytes.assign(raw.data(), raw.data() + raw.size());
  return h;
}

// The array's bytes as a flat uint8 numpy array that owns them (Python views it as its dtype).
nb::object ToNumpy(HostArray h) {
  auto* owned = new HostArray(std::move(h));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<HostArray*>(p); });
  const size_t n = owned->bytes.size();
  nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> arr(owned->bytes.data(), {n}, owner);
  return arr.cast();
}

// (dtype, shape): an array spec as Python passes it.
using Spec = std::pair<std::string, std::vector<int64_t>>;
// (dtype, global shape, mesh shape, dim_to_axis): a global array and its sharding over a slice's
// mesh (pw::Sharding: dim_to_axis[d] is the mesh axis splitting dimension d, or -1).
using Layout = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, std::vector<int>>;

Sharding ShardingOf(const Layout& l) { return Sharding(std::get<2>(l), std::get<3>(l)); }

std::pair<std::string, std::vector<int64_t>> SpecTuple(const ArraySpec& s) {
  return {std::string(DTypeName(s.dtype)),
          std::vector<int64_t>(s.shape.dims().begin(), s.shape.dims().end())};
}

}  // namespace
}  // namespace pw

NB_MODULE(_pathways, m) {
  using namespace pw;
  m.doc() = "pathways: single-controller asynchronous distributed dataflow (C++ core)";
  // As in the CLI: Debian's abseil has debug deadlock detection on, which walks a global graph on
  // every Mutex destruction (one per future) and dominated dispatch profiles.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Statuses raise pathways.errors.<code> (all RuntimeErrors), carrying the status message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      nb::object cls = nb::module_::import_("pathways.errors")
                           .attr("_for_code")(static_cast<int>(e.status().code()));
      nb::object err = cls(std::string(e.status().message()));
      PyErr_SetObject(cls.ptr(), err.ptr());
    }
  });

  nb::class_<EmbeddedCluster>(m, "EmbeddedCluster")
      .def_static(
          "create",
          [](int islands, int hosts_per_island, int devices_per_host) {
            return Unwrap(EmbeddedCluster::Create(
                Unwrap(ClusterSpec::Uniform(islands, hosts_per_island, devices_per_host))));
          },
          nb::arg("islands"), nb::arg("hosts_per_island"), nb::arg("devices_per_host"))
      // Its Prometheus metrics at http://listen/metrics while the result lives.
      .def(
          "serve_metrics",
          [](EmbeddedCluster& cluster, const std::string& listen) {
            return Unwrap(cluster.ServeMetrics(listen));
          },
          nb::keep_alive<0, 1>())
      // Takes a device out of service, as a lost host's are (its work fails with `reason`).
      .def("remove_device",
           [](EmbeddedCluster& cluster, int64_t device, const std::string& reason) {
             absl::Status s;
             {
               nb::gil_scoped_release release;
               s = cluster.RemoveDevice(DeviceId(device), reason).Await();
             }
             Check(s);
           })
      // Failure drills: fails a host as a killed worker process fails on a process cluster (its
      // work fails, its devices leave service, its arrays are lost: DataLoss), and starts a new
      // worker for it, as a restarted process rejoins (EmbeddedCluster::FailHost/RestartHost).
      .def("fail_host",
           [](EmbeddedCluster& cluster, int64_t host, const std::string& reason) {
             absl::Status s;
             {
               nb::gil_scoped_release release;
               s = cluster.FailHost(HostId(host), reason);
             }
             Check(s);
           })
      .def("restart_host",
           [](EmbeddedCluster& cluster, int64_t host) {
             absl::Status s;
             {
               nb::gil_scoped_release release;
               s = cluster.RestartHost(HostId(host));
             }
             Check(s);
           })
      // pw status --json's object, as a JSON string (pathways.status()).
      .def("status_json", [](EmbeddedCluster& cluster) {
        absl::StatusOr<ClusterStatus> st;
        {
          nb::gil_scoped_release release;
          st = cluster.controller().Status();
        }
        return server::StatusJson(Unwrap(std::move(st)),
                                  static_cast<int64_t>(cluster.controller().num_clients()));
      });

  nb::class_<metrics::MetricsServer>(m, "MetricsServer")
      .def_prop_ro("address", &metrics::MetricsServer::address);

  // A running cluster's controller over gRPC (`pw up`, `pw controller`).
  nb::class_<rpc::RemoteController>(m, "RemoteCluster")
      .def_static(
          "dial",
          [](const std::string& address, const std::string& token) {
            nb::gil_scoped_release release;
            return Unwrap(rpc::RemoteController::Dial(address, {.token = token}));
          },
          nb::arg("address"), nb::arg("token") = "")
      .def_prop_ro("address", &rpc::RemoteController::address)
      .def("status_json", [](rpc::RemoteController& remote) {
        absl::StatusOr<::pathways::v1::ClusterStatus> st;
        {
          nb::gil_scoped_release release;
          st = remote.FullStatus();
        }
        return server::StatusJson(Unwrap(std::move(st)), remote.address());
      });
  // --cluster resolution: `flag`, else $PW_CLUSTER, else the last `pw up` cluster; "" if none.
  m.def("cluster_address", [](const std::string& flag) { return server::ClusterAddress(flag); },
        nb::arg("flag") = "");
  // The PJRT plugin this process's workers load ($PW_PJRT_PLUGIN, else the pinned CPU plugin).
  m.def("pjrt_plugin_path", [] { return pjrt::DefaultCpuPluginPath(); });

  // An operation in flight (a checkpoint's write): wait() blocks without the GIL and raises its
  // error; done() says whether it has ended.
  nb::class_<Future<>>(m, "Pending")
      .def("done", [](const Future<>& f) { return f.IsReady(); })
      .def("wait", [](const Future<>& f) {
        absl::Status s;
        {
          nb::gil_scoped_release release;
          s = f.Await();
        }
        Check(s);
      });

  nb::class_<Slice>(m, "Slice")
      .def_prop_ro("num_devices", &Slice::num_devices)
      .def_prop_ro("id", [](const Slice& s) { return s.info().id.value(); })
      .def_prop_ro("mesh_shape", [](const Slice& s) { return s.info().mesh_shape; })
      .def_prop_ro("devices", [](const Slice& s) {
        std::vector<int64_t> ids;
        for (DeviceId d : s.info().devices) ids.push_back(d.value());
        return ids;
      })
      .def_prop_ro("hosts", [](const Slice& s) {
        std::vector<int64_t> ids;
        for (HostId h : s.hosts()) ids.push_back(h.value());
        return ids;
      })
      .def_prop_ro("islands", [](const Slice& s) {
        std::vector<int64_t> ids;
        for (IslandId i : s.islands()) ids.push_back(i.value());
        return ids;
      })
      .def("release", [](const Slice& s) {
        absl::Status st;
        {
          nb::gil_scoped_release release;
          st = s.Release();
        }
        Check(st);
      });

  nb::class_<Value>(m, "Value").def_prop_ro("spec", [](const Value& v) { return SpecTuple(v.spec()); });

  nb::class_<BoundFunction>(m, "BoundFunction")
      .def_prop_ro("name", &BoundFunction::name)
      .def("__call__", [](const BoundFunction& f, const std::vector<Value>& inputs) {
        if (Tracer::Current() == nullptr) {
          throw std::invalid_argument(
              "function '" + f.name() + "' was called with traced values outside the "
              "@pw.program trace that made them (a traced value kept past its trace)");
        }
        return f(inputs);
      });

  // A device-resident array: a handle to a buffer in the object store.
  nb::class_<Array>(m, "Array")
      .def_prop_ro("spec", [](const Array& a) { return SpecTuple(a.spec()); })
      // (mesh shape, dim_to_axis) over its slice's devices, and the slice's id.
      .def_prop_ro("sharding", [](const Array& a) {
        const Sharding& s = a.sharding();
        return std::make_pair(std::vector<int64_t>(s.mesh_shape().begin(), s.mesh_shape().end()),
                              std::vector<int>(s.dim_to_axis().begin(), s.dim_to_axis().end()));
      })
      .def_prop_ro("slice_id", [](const Array& a) { return a.slice().value(); })
      .def_prop_ro("devices", [](const Array& a) {
        std::vector<int64_t> ids;
        for (DeviceId d : a.devices()) ids.push_back(d.value());
        return ids;
      })
      .def_prop_ro("hosts", [](const Array& a) {
        std::vector<int64_t> ids;
        for (HostId h : a.hosts()) ids.push_back(h.value());
        return ids;
      })
      .def(
          "share",
          [](const Array& a, bool writable, const std::string& token) {
            absl::StatusOr<std::string> t;
            {
              nb::gil_scoped_release release;
              t = a.Share({.writable = writable, .token = token});
            }
            return Unwrap(std::move(t));
          },
          nb::arg("writable") = false, nb::arg("token") = "")
      .def("save", [](const Array& a, const std::string& path) {
        nb::gil_scoped_release release;
        return a.Save(path);
      })
      .def("is_ready", [](const Array& a) { return a.Ready().IsReady(); })
      .def("wait", [](const Array& a) {  // Raises the producing run's error, if any.
        absl::Status s;
        {
          nb::gil_scoped_release release;
          s = a.Ready().Await();
        }
        Check(s);
      })
      .def("to_numpy", [](const Array& a) {
        absl::StatusOr<HostArray> h;
        {
          nb::gil_scoped_release release;
          h = a.ToHost();
        }
        return ToNumpy(Unwrap(std::move(h)));
      });

  nb::class_<Program>(m, "Program")
      .def("explain", [](const Program& p) { return Unwrap(p.Explain()); })
      // Arrays keep their program (and so its client and cluster) alive: their handles release
      // buffers through the client, whatever order Python frees things in (at exit, say).
      .def(
          "put_arg",
          [](const Program& p, size_t i, const RawBytes& raw, const std::string& dtype,
             const std::vector<int64_t>& shape) {
            HostArray h = ToHostArray(raw, dtype, shape);
            nb::gil_scoped_release release;
            return Unwrap(p.PutArg(i, std::move(h)));  // Not a second copy.
          },
          nb::keep_alive<0, 1>())
      .def("run", [](nb::handle self, const std::vector<Array>& args, double timeout_s) {
        const Program& p = nb::cast<const Program&>(self);
        RunOptions options;
        options.timeout = absl::Seconds(timeout_s);  // 0: the cluster's default.
        std::vector<Array> outs;
        {
          nb::gil_scoped_release release;
          outs = Unwrap(p.Run(args, options));
        }
        nb::list result;
        for (Array& a : outs) {
          nb::object o = nb::cast(std::move(a));
          nb::keep_alive_obj(o, self);
          result.append(o);
        }
        return result;
      }, nb::arg("args"), nb::arg("timeout_s") = 0.0);

  nb::class_<Client>(m, "Client")
      .def_static(
          "connect",
          [](EmbeddedCluster& cluster, const std::string& name, const std::string& tenant,
             double share) {
            nb::gil_scoped_release release;
            return Unwrap(Client::Connect(&cluster.controller(), name, {tenant, share}));
          },
          nb::keep_alive<0, 1>(), nb::arg("cluster"), nb::arg("name"), nb::arg("tenant") = "",
          nb::arg("share") = 0.0)
      .def_static(
          "connect_remote",
          [](rpc::RemoteController& remote, const std::string& name, const std::string& tenant,
             double share) {
            nb::gil_scoped_release release;
            return Unwrap(Client::Connect(&remote, name, {tenant, share}));
          },
          nb::keep_alive<0, 1>(), nb::arg("remote"), nb::arg("name"), nb::arg("tenant") = "",
          nb::arg("share") = 0.0)
      .def(
          "start_trace",
          [](Client& c) {
            nb::gil_scoped_release release;
            Check(c.StartTrace());
          })
      .def(
          "stop_trace",
          [](Client& c, bool all_tenants) {
            nb::gil_scoped_release release;
            return trace::ToChromeJson(Unwrap(c.StopTrace(all_tenants)));
          },
          nb::arg("all_tenants") = false)
      .def(
          "add_slice",
          [](Client& c, int devices, const std::string& placement,
             const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& islands,
             const std::vector<int64_t>& hosts, const std::vector<int64_t>& avoid_islands) {
            SliceRequest r{.num_devices = devices, .mesh_shape = mesh_shape};
            if (placement == "island") r.placement = SlicePlacement::kIsland;
            else if (placement == "host") r.placement = SlicePlacement::kHost;
            else if (placement == "spread") r.placement = SlicePlacement::kSpread;
            else throw std::invalid_argument("placement must be 'island', 'host' or 'spread', got '" +
                                             placement + "'");
            for (int64_t i : islands) r.islands.push_back(IslandId(i));
            for (int64_t h : hosts) r.hosts.push_back(HostId(h));
            for (int64_t i : avoid_islands) r.avoid_islands.push_back(IslandId(i));
            nb::gil_scoped_release release;  // An RPC on a process cluster.
            return Unwrap(c.MakeVirtualDeviceSet().AddSlice(r));
          },
          nb::arg("devices"), nb::arg("placement") = "island",
          nb::arg("mesh_shape") = std::vector<int64_t>{}, nb::arg("islands") = std::vector<int64_t>{},
          nb::arg("hosts") = std::vector<int64_t>{},
          nb::arg("avoid_islands") = std::vector<int64_t>{}, nb::keep_alive<0, 1>())
      .def(
          "bind_stablehlo",
          [](Client& c, const std::string& name, nb::bytes module, const std::vector<Spec>& inputs,
             const std::vector<Spec>& outputs, const Slice& slice, int num_partitions,
             int collective_axis_size, const std::vector<Layout>& in_layouts,
             const std::vector<Layout>& out_layouts) {
            StableHloFunctionDef def{name, std::string(module.c_str(), module.size()), {}, {},
                                     num_partitions, collective_axis_size};
            for (const auto& [d, s] : inputs) def.inputs.push_back(SpecOf(d, s));
            for (const auto& [d, s] : outputs) def.outputs.push_back(SpecOf(d, s));
            std::vector<ArraySpec> in_g, out_g;
            std::vector<Sharding> in_s, out_s;
            for (const Layout& l : in_layouts) {
              in_g.push_back(SpecOf(std::get<0>(l), std::get<1>(l)));
              in_s.push_back(ShardingOf(l));
            }
            for (const Layout& l : out_layouts) {
              out_g.push_back(SpecOf(std::get<0>(l), std::get<1>(l)));
              out_s.push_back(ShardingOf(l));
            }
            nb::gil_scoped_release release;  // Registers on every worker (which compiles).
            FunctionInfo fn = Unwrap(c.Register(FunctionDef(std::move(def))));
            return Unwrap(c.Bind(fn, slice, std::move(in_g), std::move(in_s), std::move(out_g),
                                 std::move(out_s)));
          },
          nb::arg("name"), nb::arg("module"), nb::arg("inputs"), nb::arg("outputs"),
          nb::arg("slice"), nb::arg("num_partitions"), nb::arg("collective_axis_size"),
          nb::arg("in_layouts"), nb::arg("out_layouts"), nb::keep_alive<0, 1>())
      .def(
          "put",
          [](Client& c, const Slice& slice, const RawBytes& raw, const std::string& dtype,
             const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
             const std::vector<int>& dim_to_axis) {
            const ArraySpec spec = CheckedSpec(raw, dtype, shape);
            Sharding sharding(mesh_shape, dim_to_axis);
            // `raw` holds the numpy array until this returns: its bytes are sent from there
            // where the transport can (a wire client's large arrays), else copied once.
            const absl::Span<const uint8_t> bytes(raw.data(), raw.size());
            nb::gil_scoped_release release;
            return Unwrap(c.PutFrom(spec, bytes, slice.info().id, sharding));
          },
          nb::keep_alive<0, 1>())
      .def(
          "load",
          [](Client& c, const Slice& slice, const std::string& dtype,
             const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
             const std::vector<int>& dim_to_axis, const std::string& path) {
            const ArraySpec spec = SpecOf(dtype, shape);
            nb::gil_scoped_release release;
            return Unwrap(c.Load(slice.info().id, Sharding(mesh_shape, dim_to_axis), spec, path));
          },
          nb::keep_alive<0, 1>())
      .def("commit_checkpoint",
           [](Client& c, const std::string& path,
              const std::vector<std::pair<std::string, nb::bytes>>& files,
              const std::string& final_path) {
             std::vector<std::pair<std::string, std::string>> f;
             for (const auto& [name, b] : files)
               f.emplace_back(name, std::string(b.c_str(), b.size()));
             nb::gil_scoped_release release;
             return Unwrap(c.CommitCheckpoint(path, f, final_path));
           })
      .def(
          "import_array",
          [](Client& c, const std::string& token) {
            nb::gil_scoped_release release;
            return Unwrap(c.Import(token));
          },
          nb::keep_alive<0, 1>())
      .def("revoke",
           [](Client& c, const std::string& token) {
             absl::Status s;
             {
               nb::gil_scoped_release release;
               s = c.Revoke(token);
             }
             Check(s);
           })
      .def(
          "trace",
          [](Client& c, const std::string& name,
             const std::vector<std::pair<std::string, std::vector<int64_t>>>& args,
             const std::function<std::vector<Value>(std::vector<Value>)>& fn) {
            std::vector<ArraySpec> specs;
            for (const auto& [d, s] : args) specs.push_back(SpecOf(d, s));
            return Unwrap(c.Trace(name, specs, fn));
          },
          nb::keep_alive<0, 1>());
}
