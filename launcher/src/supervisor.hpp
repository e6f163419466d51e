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

#include "launch_plan.hpp"
#include "orphan_guard.hpp"
#include "output.hpp"

namespace ddprun {

struct WorkerOutcome {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool reaped = false;
  int wait_status = 0;                            // as from waitpid()
  std::chrono::system_clock::time_point ended;    // when ddprun reaped it
  bool ended_after_stop = false;                  // ddprun had already begun stopping the group
  std::vector<std::string> stderr_tail;           // last lines of its stderr
  std::string stderr_log;                         // its stderr log file, when kept

  bool failed() const;
  int exit_status() const;        // exit code, or 128+signal
  std::string describe() const;   // "exited with code 3", "killed by signal 9 (SIGKILL)"
};

// The job's root cause when it was not one of this node's workers (multi-node).
struct RemoteCause {
  std::string description;  // "rank 5 on node 1 (hostb): exited with code 3"
  int status = 1;           // the status every node exits with
  bool worker_failure = true;  // a worker failed (a restart may help), not a node lost or stopped
};

struct AttemptResult {
  std::vector<WorkerOutcome> workers;
  std::optional<size_t> root_cause;  // index of this node's first worker to fail
  std::optional<RemoteCause> remote; // the job's first failure, when it happened elsewhere
  int stop_signal = 0;               // signal ddprun received that stopped the attempt, or 0

  bool succeeded() const { return !root_cause && !remote && stop_signal == 0; }
  // The remote root cause's status, else the local root cause's, else 128+stop_signal, else 0.
  int exit_status() const;
};

// What an attempt tells the rest of the job (multi-node), called on ddprun's main thread.
struct AttemptHooks {
  std::function<void(const WorkerOutcome&)> on_local_failure;  // this node's first failure
};

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
  // that arrived since the last call, or 0. Never blocks.
  int poll_stop_signal();

  // Stops attempt `attempt` because of a failure elsewhere. Safe from any thread;
  // ignored when that attempt is not running or is already stopping.
  void stop_for_remote(int attempt, RemoteCause cause);

 private:
  friend class WorkerGroup;

  const LaunchPlan& plan_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  OrphanGuard guard_;
  WorkerGroup* current_ = nullptr;  // the running attempt (touched only on the io thread)
  struct DrainHook {                // how the console threads reach this Supervisor
    std::mutex mutex;
    Supervisor* supervisor = nullptr;
  };
  std::shared_ptr<DrainHook> drain_hook_;
};

}  // namespace ddprun
