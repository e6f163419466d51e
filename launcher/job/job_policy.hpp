// The job policy: how this node's ddprun runs a job from attempt to attempt. It
// joins an attempt, runs the workers, tells the other nodes about a local failure
// and hears of theirs, picks the job's root cause, decides whether to restart, and
// returns the status ddprun exits with.
//
// It sees the rest of ddprun through small interfaces, each in its own header, so
// tests drive it with fakes: Workers (this node's worker processes: the Supervisor),
// Membership (the other nodes: the RendezvousAgent, or a single node on its own),
// FailureReports (the words of a failure summary) and AttemptWatch (what watches an
// attempt from beside it). job_adapters.hpp, at the launcher's root, binds them.
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

#include "ddp/contract/job_records.hpp"
#include "job/attempt_result.hpp"
#include "job/attempt_watch.hpp"
#include "job/failure_notice.hpp"
#include "job/failure_reports.hpp"
#include "job/job_layout.hpp"
#include "job/membership.hpp"
#include "job/workers.hpp"

namespace ddprun {

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
  // `workers`, `membership` and `reports` must outlive the policy.
  JobPolicy(Workers& workers, Membership& membership, const FailureReports& reports, JobPolicyOptions options);

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
  void print_summary(const AttemptResult& result, int attempt, const std::string& next = {}) const;
  FailureNotice notice(int rank, int status, std::string what, NoticeKind kind) const;
  ddp::contract::ExitRecord exit_record(const WorkerOutcome& w) const;

  Workers& workers_;
  Membership& membership_;
  const FailureReports& reports_;
  JobPolicyOptions options_;
  int node_rank_;  // this node's rank in the attempt joined last (options' until a join)
};

}  // namespace ddprun
