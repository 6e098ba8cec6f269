#include "pw/base/spin_wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

namespace pw {

bool SpinYieldUntil(bool (*pred)(const void*), const void* arg) {
  for (int i = 0; i < kSpinYields; ++i) {
    if (pred(arg)) return true;
    sched_yield();
  }
  return pred(arg);
}

void SpinThenWait(const std::atomic<uint32_t>& word, uint32_t value, int yields) {
  for (int i = 0; i < yields; ++i) {
    if (word.load(std::memory_order_acquire) != value) return;
    sched_yield();
  }
  while (word.load(std::memory_order_acquire) == value) {
    syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT_PRIVATE, value,
            nullptr, nullptr, 0);
  }
}

void WakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace pw
