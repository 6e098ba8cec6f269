// Waiting for an atomic flag when threads outnumber cores.
//
// Device executors, collectives and futures often wait microseconds for another thread of this
// process. Sleeping in the kernel and being woken costs tens of microseconds when runnable
// threads outnumber cores; yielding the core a bounded number of times lets the thread we wait
// for run at once. After the bound, the waiter sleeps on a futex, so idle waits cost nothing.
#pragma once

#include <atomic>
#include <cstdint>

namespace pw {

// How many times SpinYieldUntil yields before its caller sleeps. Its callers (a future's Await,
// an idle device thread, a collective waiting for other processes' inputs, a mailbox's receiver)
// often wait for a thread that is not runnable yet, and then every yield is a system call and a
// switch taken from the threads that would make progress. Measured on `pw up --islands 1
// --hosts-per-island 4 --devices-per-host 2` (2 cores), binaries with 8 and with 64 in
// interleaved pairs: a client looping a 0.04 ms all-reduce program 1,749 against 1,510 calls/s,
// OpByOp 3,334 against 2,439 computations/s; `pw bench collectives` did not move measurably.
inline constexpr int kYieldsUntil = 8;

// Yields the core up to kYieldsUntil times until pred() holds; returns whether it does.
// Callers fall back to a blocking wait when it returns false.
bool SpinYieldUntil(bool (*pred)(const void*), const void* arg);
template <typename F>
bool SpinYieldUntil(const F& pred) {
  return SpinYieldUntil(+[](const void* f) { return (*static_cast<const F*>(f))(); }, &pred);
}

// Waits until `word` != `value`, yielding the core up to `yields` times before sleeping. Pair
// with WakeAll(word, sleepers) after every store that changes it (the store seq_cst).
// `sleepers` counts the threads asleep on `word`, so that a wake with none costs no system call.
// Measured: ~6 us per 8-thread rendezvous on 2 cores yielding, vs ~50 us sleeping.
inline constexpr int kSpinYields = 64;
void SpinThenWait(const std::atomic<uint32_t>& word, uint32_t value,
                  std::atomic<uint32_t>& sleepers, int yields = kSpinYields);
void WakeAll(std::atomic<uint32_t>& word, const std::atomic<uint32_t>& sleepers);

}  // namespace pw
