#include "pw/base/spin_wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

namespace pw {

bool SpinYieldUntil(bool (*pred)(const void*), const void* arg) {
  for (int i = 0; i < kYieldsUntil; ++i) {
    if (pred(arg)) return true;
    sched_yield();
  }
  return pred(arg);
}

void SpinThenWait(const std::atomic<uint32_t>& word, uint32_t value,
                  std::atomic<uint32_t>& sleepers, int yields) {
  for (int i = 0; i < yields; ++i) {
    if (word.load(std::memory_order_acquire) != value) return;
    sched_yield();
  }
  // Counted as a sleeper before the last look at `word` (both seq_cst, as the waker's store and
  // its look at `sleepers`): either this thread sees the new value, or the waker sees it asleep.
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (word.load(std::memory_order_seq_cst) == value) {
    syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT_PRIVATE, value,
            nullptr, nullptr, 0);
  }
  sleepers.fetch_sub(1, std::memory_order_relaxed);
}

void WakeAll(std::atomic<uint32_t>& word, const std::atomic<uint32_t>& sleepers) {
  if (sleepers.load(std::memory_order_seq_cst) == 0) return;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace pw
