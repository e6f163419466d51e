// Forking without a signal in between: a signal must not reach a half-made child
// through the parent's handlers (workers, the orphan guard, remote agents).
#pragma once

#include <signal.h>

namespace ddprun {

// Runs `fn` with every signal blocked in the calling thread, restoring the mask after.
template <typename Fn>
auto with_signals_blocked(Fn&& fn) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  struct Restore {
    sigset_t mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{old};
  return fn();
}

}  // namespace ddprun
