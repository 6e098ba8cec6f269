#include "pw/server/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pw::server {

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list) {
  std::vector<int> cpus;
  auto bad = [&](absl::string_view part, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU list '", list, "': '", part, "' ", why));
  };
  if (list.empty()) return absl::InvalidArgumentError("CPU list is empty");
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    auto number = [](absl::string_view d, int* n) {
      return !d.empty() && d.size() <= 9 && absl::c_all_of(d, absl::ascii_isdigit) &&
             absl::SimpleAtoi(d, n);
    };
    int first = 0, last = 0;
    if (!number(ends[0], &first) || !number(ends.size() == 2 ? ends[1] : ends[0], &last))
      return bad(part, "is not a CPU number or range (e.g. 3 or 0-3)");
    if (last < first) return bad(part, "is not an ascending range of CPU numbers");
    if (last >= CPU_SETSIZE) return bad(part, absl::StrCat("exceeds CPU ", CPU_SETSIZE - 1));
    for (int c = first; c <= last; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(absl::Span<const int> cpus) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0)
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

absl::Status BindProcessToCpus(absl::Span<const int> cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("no CPUs to bind to");
  absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  if (!allowed.ok()) return allowed.status();
  std::vector<int> missing;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (!std::binary_search(allowed->begin(), allowed->end(), c)) missing.push_back(c);
    else CPU_SET(c, &set);
  }
  if (!missing.empty())
    return absl::FailedPreconditionError(
        absl::StrCat("cannot bind to CPUs ", FormatCpuList(missing), ": this process may run on ",
                     FormatCpuList(*allowed), " only"));
  // The calling thread first (threads it starts inherit the binding), then the others, until a
  // pass finds none it has not bound (one not yet bound may have started another meanwhile).
  if (sched_setaffinity(0, sizeof(set), &set) != 0)
    return absl::InternalError(absl::StrCat("sched_setaffinity: ", std::strerror(errno)));
  absl::flat_hash_set<int> bound;
  for (bool found_new = true; found_new;) {
    found_new = false;
    std::error_code error;
    std::filesystem::directory_iterator it("/proc/self/task", error), end;
    for (; !error && it != end; it.increment(error)) {
      int tid = 0;
      if (!absl::SimpleAtoi(it->path().filename().string(), &tid) || !bound.insert(tid).second)
        continue;
      found_new = true;
      // A thread may exit meanwhile (ESRCH): nothing to bind.
      if (sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH)
        return absl::InternalError(absl::StrCat("sched_setaffinity(", tid, "): ",
                                                std::strerror(errno)));
    }
    if (error) return absl::InternalError(absl::StrCat("/proc/self/task: ", error.message()));
  }
  return absl::OkStatus();
}

std::vector<std::vector<int>> SplitCpus(absl::Span<const int> cpus, int hosts) {
  std::vector<std::vector<int>> split(std::max(hosts, 0));
  const size_t n = cpus.size();
  if (n == 0) return split;
  for (int h = 0; h < hosts; ++h) {
    const size_t begin = std::min(n - 1, h * n / hosts);
    const size_t end = std::max(begin + 1, (h + 1) * n / hosts);
    split[h].assign(cpus.begin() + begin, cpus.begin() + end);
  }
  return split;
}

}  // namespace pw::server
