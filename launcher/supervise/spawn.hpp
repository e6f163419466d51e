// Starting one worker process: fork + execve with the worker in its own session and
// process group, killed by the kernel if ddprun dies (PR_SET_PDEATHSIG), default signal
// dispositions and an empty signal mask, stdout/stderr on the given pipe ends.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "plan/launch_plan.hpp"

namespace ddprun {

struct SpawnRequest {
  const WorkerCommand* command = nullptr;
  const std::vector<std::string>* environment = nullptr;  // "KEY=VALUE" entries
  int stdout_fd = -1;  // becomes the worker's fd 1
  int stderr_fd = -1;  // becomes the worker's fd 2
};

// Returns the worker's pid, which is also its process-group id. Throws LaunchError
// when fork fails. An execve failure shows up as the worker exiting with 127 (not
// found) or 126 (not runnable) after one line on its stderr, as in a shell.
pid_t spawn_worker(const SpawnRequest& request);

// Runs `fn` with every signal blocked in the calling thread, restoring the mask after.
// Forks happen inside it so a signal cannot reach a half-made child through the
// parent's handlers.
template <typename Fn>
auto with_signals_blocked(Fn&& fn);

}  // namespace ddprun

#include <signal.h>

template <typename Fn>
auto ddprun::with_signals_blocked(Fn&& fn) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  struct Restore {
    sigset_t mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{old};
  return fn();
}
