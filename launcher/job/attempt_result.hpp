// What one attempt of this node's workers came to (the Supervisor's answer), and the
// hook through which an attempt tells the rest of the job about a local failure.
// Plain data: the job policy and the failure summary read it without the Supervisor.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "job/failure_notice.hpp"

namespace ddprun {

// A worker's log file that ddprun could not write to the end.
struct LogFailure {
  std::string path;   // the log file
  std::string error;  // what went wrong, e.g. "No space left on device"
};

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
  std::vector<LogFailure> incomplete_logs;        // its log files that lack part of its output
  std::string error_file;                         // its TORCHELASTIC_ERROR_FILE, when it had one

  bool failed() const;
  int exit_status() const;        // exit code, or 128+signal
  std::string describe() const;   // "exited with code 3", "killed by signal 9 (SIGKILL)"
};

// The job's root cause when it was not one of this node's workers (multi-node).
struct RemoteCause {
  std::string description;  // "rank 5 on node 1 (hostb): exited with code 3"
  int status = 1;           // the status every node exits with
  NoticeKind kind = NoticeKind::kWorker;  // what ended the attempt there (decides a restart)
  std::string report;          // a stall report that ended the job (--stall_action=stop), whole
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

// "SIGTERM", or "signal N" for a signal without a name.
std::string signal_name(int sig);

// What an attempt tells the rest of the job, called on ddprun's main thread.
struct AttemptHooks {
  std::function<void(const WorkerOutcome&)> on_local_failure;  // this node's first failure
  std::function<void(const std::vector<WorkerOutcome>&)> on_started;  // every worker started (rank, pid)
  // Every worker the moment it is reaped (any status, also those ddprun stopped);
  // before on_local_failure when both apply. Must not block.
  std::function<void(const WorkerOutcome&)> on_worker_exit;
  // The node starts stopping its workers (a failure, a stop asked for, a signal): once
  // per attempt. Must not block.
  std::function<void()> on_stopping;
};

}  // namespace ddprun
