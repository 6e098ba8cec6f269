#include "absl/strings/string_view.h"
#include "absl/cleanup/cleanup.h"
#include "pw/trace/trace.h"
#include "pw/executor/native_kernels.h"

#include <cblas.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pw::native {
namespace {

// Calls fn.template operator()<T>() for the C++ type of `t`.
template <typename Fn>
absl::Status ForType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: return fn.template operator()<float>();
    case DType::kF64: return fn.template operator()<double>();
    case DType::kS32: return fn.template operator()<int32_t>();
    case DType::kS64: return fn.template operator()<int64_t>();
    default:
      return absl::UnimplementedError(
          absl::StrCat("native kernels do not support dtype ", DTypeName(t)));
  }
}

bool Supported(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kS32 || t == DType::kS64;
}

absl::StatusOr<ArraySpec> SameAsOperand(absl::Span<const ArraySpec> in, const Attrs&, int) {
  for (const auto& s : in) {
    if (!Supported(s.dtype))
      return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", DTypeName(s.dtype)));
    if (s.dtype != in[0].dtype || s.shape != in[0].shape)
      return absl::InvalidArgumentError(absl::StrCat("operands disagree: ", in[0].ToString(),
                                                     " vs ", s.ToString()));
  }
  return in[0];
}

absl::StatusOr<ArraySpec> Dim0Divisible(absl::Span<const ArraySpec> in, const Attrs&, int n) {
  if (!Supported(in[0].dtype))
    return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", DTypeName(in[0].dtype)));
  if (in[0].shape.rank() == 0 || in[0].shape.dim(0) % n != 0)
    return absl::InvalidArgumentError(absl::StrCat("operand ", in[0].ToString(),
                                                   " needs a leading dimension divisible by ",
                                                   n, " shards"));
  return in[0];
}

template <typename T>
absl::Status DivisionOverflow() {
  return absl::InvalidArgumentError(absl::StrCat("integer division overflow: ",
                                                 std::numeric_limits<T>::min(), " / -1"));
}

template <typename Op>
KernelDef ScalarOp(std::string name, Op op, bool divides = false) {
  return {std::move(name), 1, {"value"}, SameAsOperand, [op, divides](const KernelContext& c) {
            return ForType(c.output->spec().dtype, [&]<typename T>() {
              const T* x = c.operands[0]->as<T>();
              T* y = c.output->mutable_as<T>();
              T v = static_cast<T>(c.attrs.at("value"));
              if (divides && std::is_integral_v<T> && v == T(0))
                return absl::InvalidArgumentError("integer division by zero");
              const int64_t n = c.output->spec().num_elements();
              if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
                // The one quotient that does not fit (and traps on x86: SIGFPE).
                if (divides && v == T(-1)) {
                  for (int64_t i = 0; i < n; ++i)
                    if (x[i] == std::numeric_limits<T>::min()) return DivisionOverflow<T>();
                }
              }
              for (int64_t i = 0; i < n; ++i) y[i] = op(x[i], v);
              return absl::OkStatus();
            });
          }};
}

template <typename Op>
KernelDef UnaryOp(std::string name, Op op) {
  return {std::move(name), 1, {}, SameAsOperand, [op](const KernelContext& c) {
            return ForType(c.output->spec().dtype, [&]<typename T>() {
              const T* x = c.operands[0]->as<T>();
              T* y = c.output->mutable_as<T>();
              const int64_t n = c.output->spec().num_elements();
              for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(op(x[i]));
              return absl::OkStatus();
            });
          }};
}

// hold_device(x, micros): occupies the device for `micros` microseconds without the host's CPU
// (the device's thread sleeps), then copies its operand. It stands in for an accelerator
// kernel of that length on a machine without accelerators (pw bench multitenant: the paper's
// §5.2 computations of 0.04 ... 2.4 ms). At most kMaxHoldMicros, so one kernel cannot keep a
// device for long.
constexpr double kMaxHoldMicros = 10e6;
KernelDef HoldDevice() {
  KernelDef copy = UnaryOp("copy", [](auto x) { return x; });
  return {"hold_device", 1, {"micros"}, SameAsOperand,
          [copy = std::move(copy.run)](const KernelContext& c) -> absl::Status {
            const double micros = c.attrs.at("micros");
            if (!(micros >= 0 && micros <= kMaxHoldMicros))
              return absl::InvalidArgumentError(absl::StrCat(
                  "hold_device: micros ", micros, " is outside 0 ... ", kMaxHoldMicros));
            // Sleeps end within a microsecond or so, not Linux's default 50 us timer slack.
            static thread_local const bool precise = prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) == 0;
            (void)precise;
            const absl::Time until = absl::Now() + absl::Microseconds(micros);
            absl::SleepFor(until - absl::Now());
            return copy(c);
          }};
}

template <typename Op>
KernelDef BinaryOp(std::string name, Op op, bool divides = false) {
  return {std::move(name), 2, {}, SameAsOperand, [op, divides](const KernelContext& c) {
            return ForType(c.output->spec().dtype, [&]<typename T>() {
              const T* a = c.operands[0]->as<T>();
              const T* b = c.operands[1]->as<T>();
              T* y = c.output->mutable_as<T>();
              const int64_t n = c.output->spec().num_elements();
              if (divides && std::is_integral_v<T>) {
                for (int64_t i = 0; i < n; ++i)
                  if (b[i] == T(0)) return absl::InvalidArgumentError("integer division by zero");
                if constexpr (std::is_signed_v<T>) {
                  for (int64_t i = 0; i < n; ++i)
                    if (a[i] == std::numeric_limits<T>::min() && b[i] == T(-1))
                      return DivisionOverflow<T>();
                }
              }
              for (int64_t i = 0; i < n; ++i) y[i] = op(a[i], b[i]);
              return absl::OkStatus();
            });
          }};
}

KernelDef MatMul() {
  auto infer = [](absl::Span<const ArraySpec> in, const Attrs&, int) -> absl::StatusOr<ArraySpec> {
    const auto& a = in[0];
    const auto& b = in[1];
    if (a.dtype != b.dtype || (a.dtype != DType::kF32 && a.dtype != DType::kF64))
      return absl::InvalidArgumentError(
          absl::StrCat("matmul needs two f32 or two f64 operands, got ", a.ToString(), " and ",
                       b.ToString()));
    if (a.shape.rank() != 2 || b.shape.rank() != 2 || a.shape.dim(1) != b.shape.dim(0))
      return absl::InvalidArgumentError(absl::StrCat("matmul shapes do not chain: ",
                                                     a.ToString(), " x ", b.ToString()));
    for (int64_t d : {a.shape.dim(0), a.shape.dim(1), b.shape.dim(1)}) {
      if (d > std::numeric_limits<int>::max())  // BLAS takes int dimensions.
        return absl::InvalidArgumentError(absl::StrCat("matmul dimension ", d,
                                                       " exceeds BLAS's limit of 2^31 - 1"));
    }
    return ArraySpec{a.dtype, Shape({a.shape.dim(0), b.shape.dim(1)})};
  };
  auto run = [](const KernelContext& c) {
    const auto& as = c.operands[0]->spec().shape;
    const auto& bs = c.operands[1]->spec().shape;
    const int m = static_cast<int>(as.dim(0)), k = static_cast<int>(as.dim(1)),
              n = static_cast<int>(bs.dim(1));
    if (k == 0) {  // A sum of no products: zeros (BLAS returns without writing the output).
      std::memset(c.output->mutable_data(), 0, c.output->spec().size_bytes());
      return absl::OkStatus();
    }
    if (c.output->spec().dtype == DType::kF32) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f,
                  c.operands[0]->as<float>(), k, c.operands[1]->as<float>(), n, 0.0f,
                  c.output->mutable_as<float>(), n);
    } else {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0,
                  c.operands[0]->as<double>(), k, c.operands[1]->as<double>(), n, 0.0,
                  c.output->mutable_as<double>(), n);
    }
    return absl::OkStatus();
  };
  return {"matmul", 2, {}, infer, run};
}

// Runs the collective with `combine` over every shard's (input, output) pointers.
absl::Status Rendezvous(const KernelContext& c, absl::string_view kind,
                        const Collectives::Combine& combine) {
  if (c.launch.collectives == nullptr)
    return absl::FailedPreconditionError("collective launched without a communicator");
  CollectiveKey key = c.launch.key;
  key.op = c.op_index;
  trace::Span span(trace::DeviceTrack(c.launch.device), "collective", kind);
  span.Arg("run", key.run).Arg("bytes", static_cast<int64_t>(c.operands[0]->size_bytes()))
      .Arg("ranks", static_cast<int64_t>(c.launch.slice_devices.size()));
  const int64_t t0 = Collectives::Timed() ? trace::Now() : 0;
  absl::Cleanup count = [&] { c.launch.collectives->Count(t0 == 0 ? 0 : trace::Now() - t0); };
  return c.launch.collectives->Run(key, c.launch.slice_devices, c.launch.rank,
                                   c.operands[0]->data(), c.operands[0]->size_bytes(),
                                   c.output->mutable_data(), c.output->size_bytes(), combine);
}

template <typename Op>
KernelDef AllReduce(std::string name, Op op) {
  const std::string label = name;  // Its trace spans' name.
  return {std::move(name), 1, {}, SameAsOperand, [op, label](const KernelContext& c) {
            if (c.launch.collectives == nullptr)
              return absl::FailedPreconditionError("collective launched without a communicator");
            const DType t = c.output->spec().dtype;
            CollectiveKey key = c.launch.key;
            key.op = c.op_index;
            // Optional attribute "algorithm": 1 asks for the one-round broadcast (a baseline).
            auto a = c.attrs.find("algorithm");
            const auto algorithm = a != c.attrs.end() && a->second == 1
                                       ? Collectives::Algorithm::kBroadcast
                                       : Collectives::Algorithm::kAuto;
            auto reduce = [t, op](void* acc, const void* x, size_t bytes) {
              ForType(t, [&]<typename T>() {
                T* r = static_cast<T*>(acc);
                const T* y = static_cast<const T*>(x);
                for (size_t i = 0, n = bytes / sizeof(T); i < n; ++i) r[i] = op(r[i], y[i]);
                return absl::OkStatus();
              }).IgnoreError();  // The dtype was checked when the function was compiled.
            };
            trace::Span span(trace::DeviceTrack(c.launch.device), "collective", label);
            span.Arg("run", key.run).Arg("bytes", static_cast<int64_t>(c.output->size_bytes()))
                .Arg("ranks", static_cast<int64_t>(c.launch.slice_devices.size()));
            const int64_t t0 = Collectives::Timed() ? trace::Now() : 0;
            absl::Cleanup count = [&] {
              c.launch.collectives->Count(t0 == 0 ? 0 : trace::Now() - t0);
            };
            return c.launch.collectives->AllReduce(key, c.launch.slice_devices, c.launch.rank,
                                                   c.operands[0]->data(), c.output->mutable_data(),
                                                   c.output->size_bytes(), DTypeSize(t), reduce,
                                                   algorithm);
          }};
}

KernelDef AllGather() {
  auto infer = [](absl::Span<const ArraySpec> in, const Attrs&, int n) -> absl::StatusOr<ArraySpec> {
    if (!Supported(in[0].dtype) || in[0].shape.rank() == 0)
      return absl::InvalidArgumentError(
          absl::StrCat("all_gather needs an array of rank >= 1, got ", in[0].ToString()));
    std::vector<int64_t> dims(in[0].shape.dims().begin(), in[0].shape.dims().end());
    dims[0] *= n;
    return ArraySpec{in[0].dtype, Shape(dims)};
  };
  auto run = [](const KernelContext& c) {
    const size_t chunk = c.operands[0]->size_bytes();
    return Rendezvous(c, "all_gather", [=](absl::Span<const void* const> in, absl::Span<void* const> out) {
      for (size_t d = 0; d < out.size(); ++d)
        for (size_t s = 0; s < in.size(); ++s)
          std::memcpy(static_cast<char*>(out[d]) + s * chunk, in[s], chunk);
      return absl::OkStatus();
    });
  };
  return {"all_gather", 1, {}, infer, run};
}

KernelDef ReduceScatterSum() {
  auto infer = [](absl::Span<const ArraySpec> in, const Attrs& a, int n) -> absl::StatusOr<ArraySpec> {
    auto s = Dim0Divisible(in, a, n);
    if (!s.ok()) return s;
    std::vector<int64_t> dims(s->shape.dims().begin(), s->shape.dims().end());
    dims[0] /= n;
    return ArraySpec{s->dtype, Shape(dims)};
  };
  auto run = [](const KernelContext& c) {
    const int64_t per = c.output->spec().num_elements();
    const DType t = c.output->spec().dtype;
    return Rendezvous(c, "reduce_scatter_sum", [=](absl::Span<const void* const> in, absl::Span<void* const> out) {
      return ForType(t, [&]<typename T>() {
        for (size_t d = 0; d < out.size(); ++d) {
          T* r = static_cast<T*>(out[d]);
          for (int64_t i = 0; i < per; ++i) r[i] = T(0);
          for (size_t s = 0; s < in.size(); ++s) {
            const T* x = static_cast<const T*>(in[s]) + d * per;
            for (int64_t i = 0; i < per; ++i) r[i] += x[i];
          }
        }
        return absl::OkStatus();
      });
    });
  };
  return {"reduce_scatter_sum", 1, {}, infer, run};
}

KernelDef AllToAll() {
  auto run = [](const KernelContext& c) {
    const size_t n = c.launch.slice_devices.size();
    const size_t chunk = c.output->size_bytes() / n;
    return Rendezvous(c, "all_to_all", [=](absl::Span<const void* const> in, absl::Span<void* const> out) {
      // Chunk j of shard s goes to shard j, at position s.
      for (size_t d = 0; d < out.size(); ++d)
        for (size_t s = 0; s < in.size(); ++s)
          std::memcpy(static_cast<char*>(out[d]) + s * chunk,
                      static_cast<const char*>(in[s]) + d * chunk, chunk);
      return absl::OkStatus();
    });
  };
  return {"all_to_all", 1, {}, Dim0Divisible, run};
}

absl::flat_hash_map<std::string, KernelDef> BuildRegistry() {
  std::vector<KernelDef> defs = {
      ScalarOp("add_scalar", [](auto x, auto v) { return x + v; }),
      ScalarOp("sub_scalar", [](auto x, auto v) { return x - v; }),
      ScalarOp("mul_scalar", [](auto x, auto v) { return x * v; }),
      ScalarOp("div_scalar", [](auto x, auto v) { return x / v; }, /*divides=*/true),
      ScalarOp("max_scalar", [](auto x, auto v) { return std::max(x, v); }),
      UnaryOp("neg", [](auto x) { return -x; }),
      UnaryOp("copy", [](auto x) { return x; }),
      UnaryOp("exp", [](auto x) { return std::exp(x); }),
      UnaryOp("log", [](auto x) { return std::log(x); }),
      UnaryOp("tanh", [](auto x) { return std::tanh(x); }),
      UnaryOp("sqrt", [](auto x) { return std::sqrt(x); }),
      UnaryOp("relu", [](auto x) { return x > 0 ? x : decltype(x)(0); }),
      HoldDevice(),
      BinaryOp("add", [](auto a, auto b) { return a + b; }),
      BinaryOp("sub", [](auto a, auto b) { return a - b; }),
      BinaryOp("mul", [](auto a, auto b) { return a * b; }),
      BinaryOp("div", [](auto a, auto b) { return a / b; }, /*divides=*/true),
      BinaryOp("max", [](auto a, auto b) { return std::max(a, b); }),
      BinaryOp("min", [](auto a, auto b) { return std::min(a, b); }),
      MatMul(),
      AllReduce("all_reduce_sum", [](auto a, auto b) { return a + b; }),
      AllReduce("all_reduce_max", [](auto a, auto b) { return std::max(a, b); }),
      AllReduce("all_reduce_min", [](auto a, auto b) { return std::min(a, b); }),
      AllReduce("all_reduce_prod", [](auto a, auto b) { return a * b; }),
      AllGather(),
      ReduceScatterSum(),
      AllToAll(),
  };
  absl::flat_hash_map<std::string, KernelDef> m;
  for (auto& d : defs) m.emplace(d.name, std::move(d));
  return m;
}

const absl::flat_hash_map<std::string, KernelDef>& Registry() {
  static const auto* registry = new absl::flat_hash_map<std::string, KernelDef>(BuildRegistry());
  return *registry;
}

}  // namespace

const KernelDef* FindKernel(absl::string_view name) {
  auto it = Registry().find(name);
  return it == Registry().end() ? nullptr : &it->second;
}

std::vector<std::string> KernelNames() {
  std::vector<std::string> names;
  for (const auto& [n, _] : Registry()) names.push_back(n);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace pw::native
