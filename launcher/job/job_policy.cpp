// The job policy (job_policy.hpp): the attempt loop, the root-cause choice, the
// restart rule and the exit status.
#include "job/job_policy.hpp"

#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include "errors.hpp"

namespace ddprun {

using std::chrono::seconds;

JobPolicy::JobPolicy(Workers& workers, Membership& membership, const FailureReports& reports, JobPolicyOptions options)
    : workers_(workers),
      membership_(membership),
      reports_(reports),
      options_(std::move(options)),
      node_rank_(options_.node_rank) {}

FailureNotice JobPolicy::notice(int rank, int status, std::string what, NoticeKind kind) const {
  return {node_rank_, rank, status, options_.hostname, std::move(what), kind};
}

ddp::contract::ExitRecord JobPolicy::exit_record(const WorkerOutcome& w) const {
  ddp::contract::ExitRecord r;
  r.rank = w.rank;
  r.node_rank = node_rank_;
  r.host = options_.hostname;
  r.pid = static_cast<int>(w.pid);
  if (WIFSIGNALED(w.wait_status)) r.signal = WTERMSIG(w.wait_status);
  else r.exit_code = WEXITSTATUS(w.wait_status);
  r.time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(w.ended.time_since_epoch()).count();
  return r;
}

std::chrono::milliseconds JobPolicy::linger_after_failure() const {
  return options_.hosts_store ? seconds(1) : seconds(0);
}

void JobPolicy::print_summary(const AttemptResult& result, int attempt, const std::string& next) const {
  if (!options_.print || (options_.wants_summary && !options_.wants_summary(result))) return;
  options_.print(reports_.failure_summary(result, attempt, next));
}

int JobPolicy::run() {
  int attempt = 0;
  while (true) {
    AttemptEnd end = run_attempt(attempt);
    if (end.status) return *end.status;
    attempt = end.attempt + 1;
  }
}

int JobPolicy::interrupted_join(int attempt, int signal) {
  std::string sig = signal_name(signal);
  // A fixed job cannot go on without this node: every node ends. An elastic node only
  // leaves (marked lost, so no forming attempt waits for it): a notice would end a
  // running attempt it never took part in.
  if (!options_.elastic) {
    membership_.publish_failure(attempt, notice(-1, 128 + signal, "ddprun received " + sig +
                                                                      " while joining the rendezvous",
                                                NoticeKind::kStop));
  }
  membership_.leave(attempt, seconds(0));
  spdlog::error("received {} while joining the rendezvous; no worker was started", sig);
  return 128 + signal;
}

JobPolicy::AttemptEnd JobPolicy::run_attempt(int asked) {
  JobLayout layout;
  try {
    layout = membership_.join(asked);
  } catch (const Interrupted& stop) {
    return {asked, interrupted_join(asked, stop.signal)};
  } catch (const JobOver& over) {
    if (over.status == 0) spdlog::info("{}", over.message);
    else spdlog::error("{}", over.message);
    // The store's host lingers, so the nodes still waiting read the end before it goes.
    membership_.leave(asked, linger_after_failure());
    return {asked, over.status};
  } catch (const LaunchError&) {
    // An elastic job gave up (fewer than MIN): as above. A fixed join lingered already.
    if (options_.elastic) membership_.leave(asked, linger_after_failure());
    throw;
  }
  const int attempt = layout.attempt;
  node_rank_ = layout.node_rank;
  workers_.prepare(attempt);

  std::optional<FailureNotice> winner;  // the job's first failure, once this node published one
  membership_.start_watch(attempt, [this, attempt](const FailureNotice& n) {
    workers_.stop_for_remote(attempt, {n.describe(), n.status, n.kind, {}});
  });
  // The watch calls into this policy: it must stop before an exception leaves here.
  struct StopWatch {
    Membership& m;
    ~StopWatch() { m.stop_watch(); }
  } stop_watch_on_exit{membership_};
  AttemptHooks hooks;
  hooks.on_worker_exit = [&](const WorkerOutcome& w) { membership_.publish_exit(attempt, exit_record(w)); };
  hooks.on_local_failure = [&](const WorkerOutcome& w) {
    // Other nodes see the exception too, when the worker's @record left one.
    std::string what = w.describe();
    if (std::string exception = reports_.worker_exception(w); !exception.empty()) what += ": " + exception;
    winner = membership_.publish_failure(attempt, notice(w.rank, w.exit_status(), std::move(what), NoticeKind::kWorker));
  };
  // A watch may end the job (--stall_action=stop): this node's workers stop first, so
  // its own summary carries the whole report, then every other node hears of it.
  auto stop_job = [this, attempt](const JobStop& stop) {
    workers_.stop_for_remote(attempt, {stop.headline, stop.status, NoticeKind::kStop, stop.report});
    membership_.publish_failure(attempt, notice(-1, stop.status, stop.headline, NoticeKind::kStop));
  };
  hooks.on_stopping = [&] {
    for (AttemptWatch* w : options_.watches) w->stopping(attempt);
  };
  hooks.on_started = [&](const std::vector<WorkerOutcome>& started) {
    for (AttemptWatch* w : options_.watches) w->started(attempt, layout, started, stop_job);
  };
  struct EndWatches {
    const std::vector<AttemptWatch*>& watches;
    int attempt;
    ~EndWatches() {
      for (AttemptWatch* w : watches) w->ended(attempt);
    }
  };
  AttemptResult result;
  {
    EndWatches end_watches{options_.watches, attempt};
    result = workers_.run(attempt, layout, hooks);
  }

  if (result.stop_signal != 0 && !result.root_cause && options_.launcher_lost && options_.launcher_lost()) {
    // Nobody asked for this stop: the node lost its launcher. It is a lost node, as
    // its will would have said, and the store may be gone with the launcher.
    const FailureNotice lost = notice(-1, kExitNodeLost, "ddprun lost its connection to the launching ddprun and stopped its workers",
                                      NoticeKind::kNodeLost);
    winner = membership_.publish_failure(attempt, lost);
    if (!winner) winner = lost;
    result.stop_signal = 0;
  } else if (result.stop_signal != 0 && !result.root_cause) {
    // An elastic job goes on without this node; a fixed one ends everywhere.
    const int sig = result.stop_signal;
    const std::string said = "ddprun received " + signal_name(sig);
    winner = membership_.publish_failure(
        attempt, options_.elastic ? notice(-1, 128 + sig, said + " and left the job", NoticeKind::kNodeLost)
                                  : notice(-1, 128 + sig, said + " and stopped its workers", NoticeKind::kStop));
  } else if (result.succeeded()) {
    winner = membership_.exit_barrier(attempt);
  }
  membership_.stop_watch();  // (again on exit: stop_watch is idempotent)
  settle_root_cause(result, winner);

  if (result.succeeded()) {
    std::string incomplete = reports_.incomplete_logs(result);
    if (!incomplete.empty()) spdlog::warn("{}", incomplete);
    if (options_.elastic) membership_.end_job(attempt, 0, "the job finished");
    membership_.leave(attempt, options_.hosts_store ? seconds(5) : seconds(0));
    return {attempt, 0};
  }
  return {attempt,
          options_.elastic ? after_elastic_failure(layout, result, winner) : after_fixed_failure(layout, result)};
}

std::optional<int> JobPolicy::after_fixed_failure(const JobLayout& layout, const AttemptResult& result) {
  const int attempt = layout.attempt;
  print_summary(result, attempt);
  // A restart helps after a worker failure; not when a node was lost or told to stop
  // (it will not rejoin, and the others would wait out the join timeout for it).
  bool worker_failure = result.remote ? result.remote->kind == NoticeKind::kWorker : result.root_cause.has_value();
  if (result.stop_signal == 0 && worker_failure && attempt < options_.max_restarts) {
    spdlog::warn("restarting the workers ({} of {} restarts)", attempt + 1, options_.max_restarts);
    return std::nullopt;
  }
  membership_.leave(attempt, linger_after_failure());
  return result.exit_status();
}

std::optional<int> JobPolicy::after_elastic_failure(const JobLayout& layout, const AttemptResult& result,
                                                     const std::optional<FailureNotice>& winner) {
  const int attempt = layout.attempt;
  // What ended the attempt: the first notice published, or this node's own worker, of
  // the kind the membership settled (after another node finished: kStop, as every node
  // reads it).
  const NoticeKind kind = result.remote ? result.remote->kind : winner ? winner->kind : NoticeKind::kWorker;
  if (result.stop_signal == 0 && kind == NoticeKind::kGrow) {
    spdlog::info("{}; re-forming the job with more nodes (a node joining uses no restart)",
                 result.remote->description);
    return std::nullopt;
  }
  if (result.stop_signal != 0) {
    // This node leaves (its notice lets the others re-form) and says why it ended: the
    // job, and whatever failed in it, goes on without it.
    print_summary(result, attempt);
    membership_.leave(attempt, linger_after_failure());
    return 128 + result.stop_signal;
  }
  const bool failure = kind == NoticeKind::kWorker || kind == NoticeKind::kNodeLost;
  const bool reform = failure && layout.restart_count < options_.max_restarts;
  // The job ends here. Nodes waiting to be admitted hear of it first (before the
  // summary takes its time), unless the store that would tell them is what this node lost.
  if (!reform && kind != NoticeKind::kStoreLost) {
    std::string why = failure ? "no restart left (--max_restarts=" + std::to_string(options_.max_restarts) + ")"
                              : "the job was stopped";
    membership_.end_job(attempt, result.exit_status(), why);
  }
  const std::string reforming =
      reform ? std::string("re-forming the job ") +
                   (kind == NoticeKind::kNodeLost ? "without the lost node" : "after a worker failure") + " (restart " +
                   std::to_string(layout.restart_count + 1) + " of " + std::to_string(options_.max_restarts) + ")"
             : std::string();
  // A node that goes on says so where a node that ends says its exit status.
  print_summary(result, attempt, reform ? "this node goes on: " + reforming : std::string());
  if (reform) {
    spdlog::warn("{}", reforming);
    return std::nullopt;
  }
  membership_.leave(attempt, linger_after_failure());
  return result.exit_status();
}

void JobPolicy::settle_root_cause(AttemptResult& result, std::optional<FailureNotice> winner) {
  // The job's root cause is whatever was published first, wherever that was: another
  // node's failure, or this node's own notice when it was not a worker of this node.
  bool local_worker_won = winner && result.root_cause && winner->node == node_rank_ && winner->rank >= 0;
  if (winner && !local_worker_won && !result.remote) {
    result.remote = RemoteCause{winner->describe(), winner->status, winner->kind, {}};
  }
}

}  // namespace ddprun
