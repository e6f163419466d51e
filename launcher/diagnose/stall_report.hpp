// The stall report ddprun prints when a job stops making progress or a collective
// fails. Two parts:
//   analysis   from every rank's ProgressRecord: per process group, which ranks wait
//              in which call and since when, which ranks never arrived and what each
//              of them last completed; ranks without a record are named as such
//   processes  per worker process on this node: alive or not, its /proc state and
//              wchan, and the native stack of every thread (gdb in batch mode; py-spy
//              for Python workers when it is installed)
// The analysis is a pure function of the records, so every node computes the same one.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/contract/job_records.hpp"
#include "diagnose/wait_graph.hpp"

namespace ddprun {

// Changes whenever any rank completes a call in any group (the total of completed counts).
uint64_t progress_signature(const ProgressRecords& records);
// Some rank has issued a call that has not completed yet (it waits in it).
bool any_rank_waiting(const ProgressRecords& records);
// Some rank's current call is in state "failed" (e.g. a collective that timed out).
bool any_call_failed(const ProgressRecords& records);
// The latest time a call completed on any rank (unix ms), if the records show one.
std::optional<int64_t> last_completion_ms(const ProgressRecords& records);

struct StallAnalysis {
  std::string headline;     // one line: "rank 1 never arrived at all_reduce #57 of group 0 ..."
  std::string text;         // per group, several indented lines
  std::vector<int> stalled; // ranks that never arrived (the likely culprits), or else the waiting ones
};

// The cross-rank part of the report as of `now_ms` (unix ms).
StallAnalysis analyse_stall(const ProgressRecords& records, int64_t now_ms);

struct WorkerProcess {
  int rank = 0;
  pid_t pid = -1;
};

// A worker of this node that is stopped: SIGSTOP (or SIGTSTP), or a tracer.
struct StoppedWorker {
  WorkerProcess process;
  bool traced = false;
};

// The headline when workers are stopped: the likely cause ("rank 2 (pid 123) is
// stopped (SIGSTOP): the others wait for it in all_reduce #7 of group 0").
std::string stopped_headline(const ProgressRecords& records, const std::vector<StoppedWorker>& stopped);

struct ProcessReportOptions {
  std::chrono::milliseconds stack_timeout{10000};  // per process; all run at once
  bool stacks = true;                              // false: state and wchan only
};

// The process-level part for this node's workers, one section each (`host` names the node).
std::string describe_processes(const std::string& host, const std::vector<WorkerProcess>& workers,
                               const ProcessReportOptions& options);

// /proc/<pid>/stat's state letter with its meaning ("S (sleeping)"), or "" when gone.
std::string process_state(pid_t pid);
// CPU time (user + system, in clock ticks) a process, its live descendants and the
// children it has waited for used so far; nothing when the process is gone.
std::optional<uint64_t> process_tree_cpu_ticks(pid_t pid);
// Resident memory in KiB from /proc/<pid>/status, or -1.
int64_t process_rss_kb(pid_t pid);

}  // namespace ddprun
