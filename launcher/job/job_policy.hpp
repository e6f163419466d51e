// The job policy: how this node's ddprun runs a job from attempt to attempt. It
// joins an attempt, runs the workers, tells the other nodes about a local failure
// and hears of theirs, picks the job's root cause, decides whether to restart, and
// returns the status ddprun exits with.
//
// It sees the rest of ddprun through two small interfaces, so tests drive it with
// fakes: Workers (this node's worker processes: the Supervisor) and Membership (the
// other nodes: the RendezvousAgent, or a single node on its own).
//
// Rules for every job:
//   - An attempt is joined first, then readied (log folders) under the number the
//     membership returned: an elastic node may join a later attempt than asked.
//   - The job's root cause is the first failure published anywhere; on one node, the
//     first worker to fail (or the stop signal). Notices and exit records name this
//     node by its rank in the attempt (layout.node_rank).
//   - Exit status: the root cause's (a worker's code or 128+signal), 128+signal for a
//     stop signal, 0 when every node's workers succeeded. JobOver from the join (an
//     elastic job that ended without this node): its message and its status.
//   - Every way out leaves the membership; the node hosting the store lingers after a
//     failure, a JobOver or an elastic join that gave up, so others read the outcome.
// A fixed job (--nnodes N):
//   - A restart follows a worker failure (here or elsewhere) while restarts are left
//     (--max_restarts); never a lost node or a stop signal (a stop is published, kStop,
//     and every node ends).
// An elastic job (--nnodes MIN:MAX), by what ended the attempt (NoticeKind: the
// remote notice's kind; for a worker of this node, the kind publish_failure returned:
// kWorker, or kStop when a node had finished first, as every node reads it), torchrun's rule:
//   - kGrow (a node joins): one info line, no failure summary, the job re-forms at
//     once; no restart is counted. Also after success when the exit barrier says so.
//   - kWorker, kNodeLost (a failure): the failure summary; while the attempt's
//     restart_count < --max_restarts the job re-forms (the membership counts the
//     restart in the next attempt's layout), else end_job() and leave.
//   - a stop signal on this node: it publishes kNodeLost ("left the job") so the
//     others re-form without it, leaves and exits 128+signal (whatever else failed).
//     During a join it only leaves: a notice would end an attempt it never ran in.
//   - kStop (stall stop, exit barrier timeout) and kStoreLost end the job as in a
//     fixed one; end_job() tells waiting nodes, except when the store is lost.
//   - Success: end_job(0) tells nodes waiting to be admitted that the job is over.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "job/attempt_result.hpp"
#include "ddp/contract/job_records.hpp"
#include "job/failure_notice.hpp"
#include "plan/launch_plan.hpp"

namespace ddprun {

// This node's workers.
class Workers {
 public:
  virtual ~Workers() = default;
  // Readies attempt `attempt` before this node joins it (its log folders). Throws LaunchError.
  virtual void prepare(int attempt) = 0;
  // Runs this node's workers for `attempt` until they and everything they started are
  // gone. hooks.on_worker_exit runs on the calling thread for every worker reaped,
  // hooks.on_local_failure for the first worker to fail.
  // Throws LaunchError when the workers cannot be started.
  virtual AttemptResult run(int attempt, const JobLayout& layout, const AttemptHooks& hooks) = 0;
  // Stops `attempt` because the job failed elsewhere. Safe from any thread; ignored
  // unless that attempt is running and not already stopping.
  virtual void stop_for_remote(int attempt, RemoteCause cause) = 0;
};

// Thrown by Membership::join when the job is over without this node: an elastic node
// that arrives after the job ended (or ends while it waits to be admitted).
struct JobOver {
  int status = 0;       // the status the job ended with; this ddprun exits with it
  std::string message;  // one line for the console
};

// The job's nodes, as this node takes part in them.
class Membership {
 public:
  virtual ~Membership() = default;
  // Joins `attempt` with every node and returns this node's view of it. An elastic
  // membership may join a later attempt than asked (a node that arrives while the job
  // runs): layout.attempt says which. Throws Interrupted when a stop signal arrives
  // meanwhile, LaunchError when nodes do not come (an elastic job: fewer than MIN
  // within the join timeout, named in the message), JobOver when the job ended first.
  virtual JobLayout join(int attempt) = 0;
  // Until stop_watch(): calls `on_failure` (from any thread) once a failure anywhere
  // else ends `attempt`.
  virtual void start_watch(int attempt, std::function<void(const FailureNotice&)> on_failure) = 0;
  virtual void stop_watch() = 0;
  // Publishes this node's failure. Returns the job's first failure as every node sees
  // it (maybe another node's), or nothing when no other node takes part in the job.
  virtual std::optional<FailureNotice> publish_failure(int attempt, const FailureNotice& notice) = 0;
  // Tells every rank of `attempt` that one of this node's workers has exited (any
  // status). Returns at once: the record is written in the background.
  virtual void publish_exit(int attempt, const ddp::contract::ExitRecord& record) = 0;
  // After this node's workers all succeeded: waits for every node's. Returns the
  // failure that ended the job instead, if any.
  virtual std::optional<FailureNotice> exit_barrier(int attempt) = 0;
  // Leaves the job; first waits up to `linger` for the others to leave too. An elastic
  // membership also marks this node as gone, so the others re-form without waiting for it.
  virtual void leave(int attempt, std::chrono::milliseconds linger) = 0;
  // The job is over for every node (no restart follows `attempt`; it ends with
  // `status`): nodes still waiting to be admitted hear of it and end too. Before leave().
  virtual void end_job(int attempt, int status, const std::string& why) {
    (void)attempt, (void)status, (void)why;
  }
};

// What a watch beside the attempt (stall detection) may ask for: the job ends with
// this as its root cause, through the usual failure path (every node stops).
struct JobStop {
  int status = 1;         // the status every node exits with
  std::string headline;   // one line, as the other nodes see it
  std::string report;     // this node's failure summary shows it whole
};

// Watches an attempt from beside it: stall detection, the runtime file that
// `ddprun status` reads. Both calls come on ddprun's main thread.
class AttemptWatch {
 public:
  virtual ~AttemptWatch() = default;
  // The attempt's workers started. `stop_job` may be called from any thread until ended().
  virtual void started(int attempt, const JobLayout& layout, const std::vector<WorkerOutcome>& workers,
                       std::function<void(const JobStop&)> stop_job) = 0;
  // The attempt's workers are all gone.
  virtual void ended(int attempt) = 0;
};

struct JobPolicyOptions {
  int node_rank = 0;  // --node_rank; once joined, notices name the rank the attempt gave (layout.node_rank)
  std::string hostname;
  int max_restarts = 0;
  // --nnodes MIN:MAX: a lost node (or one that leaves on a stop signal) re-forms the job
  // on the others while restarts are left; a new node re-forms it without using one.
  bool elastic = false;
  // This node hosts the store the others use: it lingers when leaving, so their last
  // answers get out before the store goes.
  bool hosts_store = false;
  // Where failure summaries go (ddprun: the console's stderr).
  std::function<void(const std::string&)> print;
  // Whether this node prints the summary of an attempt that failed (empty: always).
  // Agents of a launching ddprun print it only where the root cause is, so the
  // launcher's console shows one.
  std::function<bool(const AttemptResult&)> wants_summary;
  // Whether a stop signal this node got means it lost its launching ddprun (an agent
  // of --hostfile/--hosts): then the node is lost to the job (status 1), not stopped.
  std::function<bool()> launcher_lost;
  // Told when each attempt's workers start and end (not owned; may be empty).
  std::vector<AttemptWatch*> watches;
};

class JobPolicy {
 public:
  // `plan` names the job in summaries; all three must outlive the policy.
  JobPolicy(const LaunchPlan& plan, Workers& workers, Membership& membership, JobPolicyOptions options);

  // Runs attempts until one ends the job; returns ddprun's exit status. Throws
  // LaunchError when an attempt cannot be joined or its workers cannot start.
  int run();

 private:
  // Where an attempt left the job: ended with a status, or go on with the next attempt.
  struct AttemptEnd {
    int attempt = 0;            // the attempt this node joined (maybe later than asked)
    std::optional<int> status;  // nothing: the next attempt follows
  };
  AttemptEnd run_attempt(int attempt);
  // A stop signal arrived while joining `attempt`: the status to exit with.
  int interrupted_join(int attempt, int signal);
  // After the workers: the job's root cause, as the other nodes agreed on it.
  void settle_root_cause(AttemptResult& result, std::optional<FailureNotice> winner);
  // After a failed attempt: its status, or nothing when a restart (or re-forming) follows.
  std::optional<int> after_fixed_failure(const JobLayout& layout, const AttemptResult& result);
  std::optional<int> after_elastic_failure(const JobLayout& layout, const AttemptResult& result,
                                           const std::optional<FailureNotice>& winner);
  std::chrono::milliseconds linger_after_failure() const;
  void print_summary(const AttemptResult& result, int attempt) const;
  FailureNotice notice(int rank, int status, std::string what, NoticeKind kind) const;
  ddp::contract::ExitRecord exit_record(const WorkerOutcome& w) const;

  const LaunchPlan& plan_;
  Workers& workers_;
  Membership& membership_;
  JobPolicyOptions options_;
  int node_rank_;  // this node's rank in the attempt joined last (options' until a join)
};

}  // namespace ddprun
