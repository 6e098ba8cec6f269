#include "pw/server/cpu_binding.h"

#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pw::server {
namespace {

using Cpus = std::vector<int>;

TEST(CpuBindingTest, ParsesAndFormatsCpuLists) {
  EXPECT_EQ(*ParseCpuList("3"), Cpus({3}));
  EXPECT_EQ(*ParseCpuList("6,0-3,2"), Cpus({0, 1, 2, 3, 6}));
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 6}), "0-3,6");
  EXPECT_EQ(FormatCpuList({1, 3, 4}), "1,3-4");
  EXPECT_EQ(FormatCpuList({}), "");
}

TEST(CpuBindingTest, MalformedCpuListsAreRefusedNamingThePart) {
  for (const char* bad : {"", "a", "1,,2", "3-1", "-1", "1-", "0-99999", "1.5", " 1", "1 - 3",
                          "+2", "1-+3", "0--0", "99999999999"}) {
    absl::StatusOr<std::vector<int>> r = ParseCpuList(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseCpuList("0,x-2").status().message().find("'x-2'"), std::string::npos);
}

TEST(CpuBindingTest, SplitsCpusAmongHostsInOrder) {
  // More CPUs than hosts: disjoint blocks, sizes differing by at most one.
  auto s = SplitCpus({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 4);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s, std::vector<Cpus>({{0, 1}, {2, 3, 4}, {5, 6}, {7, 8, 9}}));
  // Fewer CPUs than hosts: neighbours share.
  s = SplitCpus({4, 7}, 4);
  EXPECT_EQ(s, std::vector<Cpus>({{4}, {4}, {7}, {7}}));
  s = SplitCpus({0, 1}, 3);
  EXPECT_EQ(s, std::vector<Cpus>({{0}, {0}, {1}}));
  EXPECT_EQ(SplitCpus({0, 1}, 2), std::vector<Cpus>({{0}, {1}}));
}

// Binds this process to `cpu` and exits 0 if the threads that ran already and those started
// afterwards are bound, and a CPU the process may no longer use is then refused, naming it.
[[noreturn]] void BindAndCheck(int cpu, const std::vector<int>& allowed) {
  std::atomic<bool> bound{false};
  std::vector<int> earlier;
  std::vector<int> later;
  std::thread before([&] {
    while (!bound.load()) std::this_thread::yield();
    earlier = *AllowedCpus();
  });
  if (!BindProcessToCpus({cpu}).ok()) std::_Exit(2);
  bound.store(true);
  before.join();
  std::thread after([&] { later = *AllowedCpus(); });
  after.join();
  if (earlier != Cpus({cpu}) || later != Cpus({cpu}) || *AllowedCpus() != Cpus({cpu}))
    std::_Exit(3);
  if (allowed.size() > 1) {
    absl::Status s = BindProcessToCpus({allowed.front()});
    if (s.code() != absl::StatusCode::kFailedPrecondition ||
        s.message().find(FormatCpuList({allowed.front()})) == std::string::npos)
      std::_Exit(4);
  }
  std::_Exit(0);
}

TEST(CpuBindingTest, BindsEveryThreadOfTheProcess) {
  auto allowed = AllowedCpus();
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_FALSE(allowed->empty());
  EXPECT_EQ(BindProcessToCpus({CPU_SETSIZE - 1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(BindProcessToCpus({}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*AllowedCpus(), *allowed);  // Unchanged by the refusals.
  if (allowed->size() < 2) GTEST_SKIP() << "binding needs two CPUs to show; this process has one";
  // In a child process: the binding is process-wide.
  EXPECT_EXIT(BindAndCheck(allowed->back(), *allowed), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace pw::server
