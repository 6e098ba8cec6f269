#include "pw/bench/io_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/bench/raw_tcp.h"
#include "pw/client/client.h"

namespace pw {
namespace {

using Clock = std::chrono::steady_clock;

// The controller's peak resident memory over a measurement, minus its memory before: the peak
// is reset as the measurement starts (ResetPeakResidentMemory), so earlier peaks do not count.
// Null: not measured.
class RssWatch {
 public:
  RssWatch(rpc::RemoteController* c, bool measure) : c_(measure ? c : nullptr) {
    if (c_ == nullptr) return;
    auto s = c_->FullStatus(/*reset_peak_memory=*/true);
    if (s.ok()) before_ = s->controller_rss_bytes();
    else status_ = s.status();
  }
  absl::StatusOr<std::optional<int64_t>> Growth() {
    if (c_ == nullptr) return std::nullopt;
    PW_RETURN_IF_ERROR(status_);
    PW_ASSIGN_OR_RETURN(auto s, c_->FullStatus());
    return std::max<int64_t>(0, s.controller_peak_rss_bytes() - before_);
  }

 private:
  rpc::RemoteController* const c_;
  absl::Status status_;
  int64_t before_ = 0;
};

// The first call of `op` (cold: on this kind of VM, memory a process touches for the first time
// costs ~5 us per 4 KiB page, which dwarfs the copy) and the steady state after it: seconds per
// call over at least min_iterations calls and min_seconds. `prepare` runs untimed before each,
// `after_first` (if set) untimed after the first.
struct Timing {
  double first = 0;
  double steady = 0;
};
absl::StatusOr<Timing> TimeCalls(const IoBenchOptions& o, const std::function<void()>& prepare,
                                 const std::function<absl::Status()>& op,
                                 const std::function<absl::Status()>& after_first = nullptr) {
  auto timed_call = [&]() -> absl::StatusOr<double> {
    prepare();
    const auto start = Clock::now();
    PW_RETURN_IF_ERROR(op());
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  Timing t;
  PW_ASSIGN_OR_RETURN(t.first, timed_call());
  if (after_first) PW_RETURN_IF_ERROR(after_first());
  int n = 0;
  double timed = 0;
  while (n < o.min_iterations || timed < o.min_seconds) {
    PW_ASSIGN_OR_RETURN(const double s, timed_call());
    timed += s;
    ++n;
  }
  t.steady = timed / n;
  return t;
}

}  // namespace

absl::StatusOr<std::vector<IoBenchResult>> RunIoBench(rpc::RemoteController* controller,
                                                      const IoBenchOptions& opts) {
  IoBenchOptions o = opts;
  if (o.sizes.empty())
    for (int64_t s = 1024; s <= (int64_t{1} << 30); s *= 4) o.sizes.push_back(s);
  for (int64_t s : o.sizes)
    if (s <= 0 || s % 8 != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("io bench: size ", s, " is not a positive multiple of 8"));
  PW_ASSIGN_OR_RETURN(auto client, Client::Connect(controller, "io-bench"));
  PW_ASSIGN_OR_RETURN(Slice slice, client->MakeVirtualDeviceSet().AddSlice({.num_devices = 2}));
  RawTcp tcp;
  PW_RETURN_IF_ERROR(tcp.Open());
  const Sharding split = Sharding::Split({2}, 2, 0);
  std::vector<IoBenchResult> results;
  for (int64_t size : o.sizes) {
    const int64_t n = size / 4;
    HostArray host{{DType::kF32, Shape({2, n / 2})}, Bytes(size)};
    for (int64_t i = 0; i < size; ++i) host.bytes[i] = static_cast<uint8_t>(i * 131 + 7);
    std::vector<char> raw(host.bytes.begin(), host.bytes.end());
    PW_ASSIGN_OR_RETURN(const Timing tcp_s, TimeCalls(o, [] {}, [&] { return tcp.Send(raw); }));
    std::vector<char>().swap(raw);

    HostArray value;
    RssWatch put_rss(controller, o.measure_controller_memory);
    absl::StatusOr<Timing> put_s = TimeCalls(
        o, [&] { value = host; },
        [&]() -> absl::Status {
          PW_ASSIGN_OR_RETURN(Array a, client->Put(std::move(value), slice.info().id, split));
          return a.Ready().Await();
        });
    if (!put_s.ok()) return put_s.status();
    PW_ASSIGN_OR_RETURN(const std::optional<int64_t> put_growth, put_rss.Growth());

    PW_ASSIGN_OR_RETURN(Array a, client->Put(host, slice.info().id, split));
    RssWatch get_rss(controller, o.measure_controller_memory);
    // The first get's array is checked (untimed) and freed before the others, which drop theirs
    // at once: a second array held meanwhile would land each of them in fresh memory.
    std::optional<HostArray> first_got;
    absl::StatusOr<Timing> get_s = TimeCalls(
        o, [] {},
        [&]() -> absl::Status {
          PW_ASSIGN_OR_RETURN(HostArray got, a.ToHost());
          if (!first_got.has_value()) first_got = std::move(got);
          return absl::OkStatus();
        },
        [&]() -> absl::Status {
          const bool same = first_got->bytes == host.bytes;  // What comes back is what went.
          first_got = HostArray();
          if (same) return absl::OkStatus();
          return absl::DataLossError(
              absl::StrCat("io bench: a ", size, "-byte array came back different"));
        });
    if (!get_s.ok()) return get_s.status();
    PW_ASSIGN_OR_RETURN(const std::optional<int64_t> get_growth, get_rss.Growth());

    const double tcp_gbps = size / tcp_s.steady / 1e9;
    for (auto [op, t, growth] : {std::tuple{"put", *put_s, put_growth},
                                 std::tuple{"get", *get_s, get_growth}}) {
      const double gbps = size / t.steady / 1e9;
      results.push_back({op, size, gbps, tcp_gbps, gbps / tcp_gbps, growth, size / t.first / 1e9});
      std::fprintf(stderr, "io bench: %s %11lld B  %7.3f GB/s  raw TCP %7.3f GB/s  ratio %.2f  "
                   "first call %7.3f GB/s  controller RSS +%lld B\n",
                   op, (long long)size, gbps, tcp_gbps, gbps / tcp_gbps, size / t.first / 1e9,
                   (long long)growth.value_or(-1));
    }
  }
  return results;
}

std::string IoBenchJson(const std::vector<IoBenchResult>& results) {
  std::string out = "{\"results\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const IoBenchResult& r = results[i];
    absl::StrAppend(&out, i ? ", " : "", "{\"op\": \"", r.op, "\", \"bytes\": ", r.bytes,
                    ", \"gbps\": ", r.gbps, ", \"raw_tcp_gbps\": ", r.raw_tcp_gbps,
                    ", \"ratio\": ", r.ratio,
                    ", \"controller_rss_growth_bytes\": ",
                    r.controller_rss_growth_bytes.has_value()
                        ? absl::StrCat(*r.controller_rss_growth_bytes)
                        : std::string("null"),
                    ", \"first_call_gbps\": ", r.first_call_gbps, "}");
  }
  return out + "]}";
}

}  // namespace pw
