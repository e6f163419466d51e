// The job policy (job_policy.hpp): the attempt loop, the root-cause choice, the
// restart rule and the exit status.
#include "job_policy.hpp"

#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include "error_files.hpp"
#include "summary.hpp"

namespace ddprun {

using std::chrono::seconds;

JobPolicy::JobPolicy(const LaunchPlan& plan, Workers& workers, Membership& membership, JobPolicyOptions options)
    : plan_(plan), workers_(workers), membership_(membership), options_(std::move(options)) {}

FailureNotice JobPolicy::notice(int rank, int status, std::string what, NoticeKind kind) const {
  return {options_.node_rank, rank, status, options_.hostname, std::move(what), kind};
}

ddp::contract::ExitRecord JobPolicy::exit_record(const WorkerOutcome& w) const {
  ddp::contract::ExitRecord r;
  r.rank = w.rank;
  r.node_rank = options_.node_rank;
  r.host = options_.hostname;
  r.pid = static_cast<int>(w.pid);
  if (WIFSIGNALED(w.wait_status)) r.signal = WTERMSIG(w.wait_status);
  else r.exit_code = WEXITSTATUS(w.wait_status);
  r.time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(w.ended.time_since_epoch()).count();
  return r;
}

int JobPolicy::run() {
  for (int attempt = 0;; ++attempt) {
    if (std::optional<int> status = run_attempt(attempt)) return *status;
  }
}

std::optional<int> JobPolicy::run_attempt(int attempt) {
  workers_.prepare(attempt);
  JobLayout layout;
  try {
    layout = membership_.join(attempt);
  } catch (const Interrupted& stop) {
    std::string sig = signal_name(stop.signal);
    membership_.publish_failure(attempt, notice(-1, 128 + stop.signal, "ddprun received " + sig +
                                                                          " while joining the rendezvous",
                                                                      NoticeKind::kStop));
    membership_.leave(attempt, seconds(0));
    spdlog::error("received {} while joining the rendezvous; no worker was started", sig);
    return 128 + stop.signal;
  }

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
    if (auto error = read_worker_error(w.error_file); error && !error->message.empty()) what += ": " + error->message;
    winner = membership_.publish_failure(attempt, notice(w.rank, w.exit_status(), std::move(what), NoticeKind::kWorker));
  };
  // A watch may end the job (--stall_action=stop): this node's workers stop first, so
  // its own summary carries the whole report, then every other node hears of it.
  auto stop_job = [this, attempt](const JobStop& stop) {
    workers_.stop_for_remote(attempt, {stop.headline, stop.status, NoticeKind::kStop, stop.report});
    membership_.publish_failure(attempt, notice(-1, stop.status, stop.headline, NoticeKind::kStop));
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

  if (result.stop_signal != 0 && !result.root_cause) {
    winner = membership_.publish_failure(
        attempt, notice(-1, 128 + result.stop_signal,
                        "ddprun received " + signal_name(result.stop_signal) + " and stopped its workers",
                        NoticeKind::kStop));
  } else if (result.succeeded()) {
    winner = membership_.exit_barrier(attempt);
  }
  membership_.stop_watch();  // (again on exit: stop_watch is idempotent)
  settle_root_cause(result, winner);

  if (result.succeeded()) {
    std::string incomplete = format_incomplete_logs(result);
    if (!incomplete.empty()) spdlog::warn("{}", incomplete);
    membership_.leave(attempt, options_.hosts_store ? seconds(5) : seconds(0));
    return 0;
  }
  if (options_.print) options_.print(format_failure_summary(plan_, result, attempt));
  // A restart helps after a worker failure; not when a node was lost or told to stop
  // (it will not rejoin, and the others would wait out the join timeout for it).
  bool worker_failure = result.remote ? result.remote->kind == NoticeKind::kWorker : result.root_cause.has_value();
  if (result.stop_signal == 0 && worker_failure && attempt < options_.max_restarts) {
    spdlog::warn("restarting the workers ({} of {} restarts)", attempt + 1, options_.max_restarts);
    return std::nullopt;
  }
  membership_.leave(attempt, options_.hosts_store ? seconds(1) : seconds(0));
  return result.exit_status();
}

void JobPolicy::settle_root_cause(AttemptResult& result, std::optional<FailureNotice> winner) {
  // The job's root cause is whatever was published first, wherever that was: another
  // node's failure, or this node's own notice when it was not a worker of this node.
  bool local_worker_won = winner && result.root_cause && winner->node == options_.node_rank && winner->rank >= 0;
  if (winner && !local_worker_won && !result.remote) {
    result.remote = RemoteCause{winner->describe(), winner->status, winner->kind, {}};
  }
}

}  // namespace ddprun
