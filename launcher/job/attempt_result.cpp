// What an attempt came to (attempt_result.hpp): the outcome of each worker in words
// and the status ddprun exits with.
#include "job/attempt_result.hpp"

#include <string.h>
#include <sys/wait.h>

namespace ddprun {

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

bool WorkerOutcome::failed() const { return reaped && exit_status() != 0; }

int WorkerOutcome::exit_status() const {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string WorkerOutcome::describe() const {
  if (!reaped) return "did not exit (still running after SIGKILL)";
  if (WIFEXITED(wait_status)) return "exited with code " + std::to_string(WEXITSTATUS(wait_status));
  int sig = WTERMSIG(wait_status);
  return "killed by " + signal_name(sig) + " (signal " + std::to_string(sig) + ")" +
         (WCOREDUMP(wait_status) ? ", core dumped" : "");
}

int AttemptResult::exit_status() const {
  // A failure that came first stays the root cause even if a signal followed it.
  if (remote) return remote->status;
  if (root_cause) return workers[*root_cause].exit_status();
  if (stop_signal != 0) return 128 + stop_signal;
  return 0;
}

}  // namespace ddprun
