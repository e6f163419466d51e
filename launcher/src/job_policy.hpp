// The job policy: how this node's ddprun runs a job from attempt to attempt. It
// joins an attempt, runs the workers, tells the other nodes about a local failure
// and hears of theirs, picks the job's root cause, decides whether to restart, and
// returns the status ddprun exits with.
//
// It sees the rest of ddprun through two small interfaces, so tests drive it with
// fakes: Workers (this node's worker processes: the Supervisor) and Membership (the
// other nodes: the RendezvousAgent, or a single node on its own).
//
// Rules:
//   - The job's root cause is the first failure published anywhere; on one node, the
//     first worker to fail (or the stop signal).
//   - A restart follows a worker failure (here or elsewhere) while restarts are left
//     (--max_restarts); never a lost node or a stop signal.
//   - Exit status: the root cause's (a worker's code or 128+signal), 128+signal for a
//     stop signal, 0 when every node's workers succeeded.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attempt_result.hpp"
#include "ddp/contract/job_records.hpp"
#include "failure_notice.hpp"
#include "launch_plan.hpp"

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
  int node_rank = 0;
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
  // One attempt; its status, or nothing when a restart follows.
  std::optional<int> run_attempt(int attempt);
  // After the workers: the job's root cause, as the other nodes agreed on it.
  void settle_root_cause(AttemptResult& result, std::optional<FailureNotice> winner);
  FailureNotice notice(int rank, int status, std::string what, NoticeKind kind) const;
  ddp::contract::ExitRecord exit_record(const WorkerOutcome& w) const;

  const LaunchPlan& plan_;
  Workers& workers_;
  Membership& membership_;
  JobPolicyOptions options_;
};

}  // namespace ddprun
