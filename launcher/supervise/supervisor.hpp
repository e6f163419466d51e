// The supervisor runs the workers of one attempt and watches them until the group
// is done: every worker exited and nothing they started is left.
//
// One thread, one Boost.Asio io_context. Events:
//   SIGCHLD            reap; the first worker to fail becomes the root cause and the
//                      rest of the group is stopped (SIGTERM, SIGKILL after the grace period)
//   INT TERM HUP QUIT  forwarded to every worker group, then the same stop; a second
//                      one skips the grace period
//   USR1 USR2          forwarded to every worker group; the job goes on (e.g. Slurm's
//                      --signal=USR1@T asks workers to checkpoint)
//   --signals_to_handle's signals: forwarded, then the same stop as INT or TERM
//   worker pipes       output to the console and log files (output.hpp)
//   grace timer        SIGKILL to whatever is left
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "job/attempt_result.hpp"
#include "job/job_layout.hpp"
#include "plan/launch_plan.hpp"
#include "supervise/error_files.hpp"
#include "supervise/orphan_guard.hpp"
#include "supervise/output.hpp"

namespace ddprun {

class WorkerGroup;

class Supervisor {
 public:
  explicit Supervisor(const LaunchPlan& plan);
  ~Supervisor();

  // Starts the workers for `attempt` (TORCHELASTIC_RESTART_COUNT) and returns when
  // they and all their descendants are gone. Throws LaunchError when the workers
  // cannot be started (those already started are killed first).
  AttemptResult run_attempt(int attempt, const JobLayout& layout, const AttemptHooks& hooks = {});

  // Between attempts (rendezvous, exit barrier): a stop signal (INT, TERM, HUP, QUIT)
  // that arrived since the last call, or 0. Never blocks. Every wait of the launcher
  // asks it at least every kStopCheckEvery (job/failure_notice.hpp).
  int poll_stop_signal();

  // Stops attempt `attempt` because of a failure elsewhere. Safe from any thread;
  // ignored when that attempt is not running or is already stopping.
  void stop_for_remote(int attempt, RemoteCause cause);

 private:
  const LaunchPlan& plan_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  OrphanGuard guard_;
  ErrorFiles error_files_;
  WorkerGroup* current_ = nullptr;  // the running attempt (touched only on the io thread)
  struct DrainHook {                // how the console threads reach this Supervisor
    std::mutex mutex;
    Supervisor* supervisor = nullptr;
  };
  std::shared_ptr<DrainHook> drain_hook_;
};

}  // namespace ddprun
