// Fakes for the job policy's interfaces (job/workers.hpp, job/membership.hpp), shared
// by the fixed and the elastic policy tests: Workers whose attempts a test scripts,
// and a Membership that behaves as the store would show the other nodes.
#pragma once

#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/wait.h>

#include <deque>
#include <map>
#include <tuple>

#include "errors.hpp"
#include "job/job_policy.hpp"
#include "job_adapters.hpp"

namespace policy_fakes {

using namespace std::chrono_literals;
using ddprun::AttemptHooks;
using ddprun::AttemptResult;
using ddprun::FailureNotice;

constexpr int kMe = 0;  // this node's rank in every test

// Workers whose attempts the test scripts: each gets the hooks and returns what the
// Supervisor would. A cause from stop_for_remote() ends the attempt as the
// Supervisor's does: in result.remote.
class FakeWorkers : public ddprun::Workers {
 public:
  using Script = std::function<AttemptResult(FakeWorkers&, const AttemptHooks&)>;
  std::vector<Script> attempts;  // the k-th run runs attempts[min(k, size-1)]
  std::vector<int> prepared, ran;
  std::vector<ddprun::JobLayout> layouts;  // as each run got it
  std::optional<ddprun::RemoteCause> told_to_stop;

  void prepare(int attempt) override { prepared.push_back(attempt); }
  AttemptResult run(int attempt, const ddprun::JobLayout& layout, const AttemptHooks& hooks) override {
    ran.push_back(attempt);
    layouts.push_back(layout);
    told_to_stop.reset();
    return attempts.at(std::min(ran.size() - 1, attempts.size() - 1))(*this, hooks);
  }
  void stop_for_remote(int, ddprun::RemoteCause cause) override {
    if (!told_to_stop) told_to_stop = std::move(cause);
  }
};

// The other nodes as a store would show them: the first failure published for an
// attempt wins (it may be preset, as if another node had published first).
class FakeMembership : public ddprun::Membership {
 public:
  int signal_during_join = 0;
  std::map<int, FailureNotice> first_failure;            // per attempt
  std::vector<FailureNotice> published;                  // by this node
  std::optional<FailureNotice> barrier_result;           // what exit_barrier() returns
  std::vector<int> barriers;
  std::vector<std::pair<int, std::chrono::milliseconds>> left;
  std::function<void(const FailureNotice&)> watcher;     // set between start_watch and stop_watch
  int watches = 0, unwatches = 0;

  std::vector<int> joins;                                // attempts asked for
  // What the next joins return, in order (an elastic membership's view); when empty, a
  // fixed job's: the attempt asked, one restart per attempt.
  std::deque<ddprun::JobLayout> layouts;
  std::optional<ddprun::JobOver> over;                   // join throws it
  std::vector<std::tuple<int, int, std::string>> ended;  // end_job(attempt, status, why)

  ddprun::JobLayout join(int attempt) override {
    joins.push_back(attempt);
    if (signal_during_join != 0) throw ddprun::Interrupted{signal_during_join};
    if (over) throw *over;
    if (!layouts.empty()) {
      ddprun::JobLayout next = layouts.front();
      layouts.pop_front();
      return next;
    }
    ddprun::JobLayout layout;
    layout.attempt = layout.restart_count = attempt;
    layout.node_rank = kMe;
    return layout;
  }
  void end_job(int attempt, int status, const std::string& why) override { ended.emplace_back(attempt, status, why); }
  void start_watch(int, std::function<void(const FailureNotice&)> on_failure) override {
    ++watches;
    watcher = std::move(on_failure);
  }
  void stop_watch() override {  // idempotent, as the agent's is
    if (watcher) ++unwatches;
    watcher = nullptr;
  }
  std::optional<FailureNotice> publish_failure(int attempt, const FailureNotice& notice) override {
    published.push_back(notice);
    return first_failure.emplace(attempt, notice).first->second;
  }
  std::optional<FailureNotice> exit_barrier(int attempt) override {
    barriers.push_back(attempt);
    return barrier_result;
  }
  void leave(int attempt, std::chrono::milliseconds linger) override { left.emplace_back(attempt, linger); }
  std::vector<std::pair<int, ddp::contract::ExitRecord>> exits;  // (attempt, record), as published
  void publish_exit(int attempt, const ddp::contract::ExitRecord& record) override {
    exits.emplace_back(attempt, record);
  }
};

inline ddprun::WorkerOutcome worker(int rank, int exit_code) {
  ddprun::WorkerOutcome w;
  w.local_rank = w.rank = rank;
  w.pid = 1000 + rank;
  w.reaped = true;
  w.wait_status = W_EXITCODE(exit_code, 0);
  return w;
}

// Scripts for FakeWorkers.
inline FakeWorkers::Script succeed() {
  return [](FakeWorkers&, const AttemptHooks&) {
    AttemptResult r;
    r.workers = {worker(0, 0), worker(1, 0)};
    return r;
  };
}
inline FakeWorkers::Script fail(int rank, int code) {
  return [=](FakeWorkers&, const AttemptHooks& hooks) {
    AttemptResult r;
    r.workers = {worker(0, 0), worker(1, 0)};
    r.workers[static_cast<size_t>(rank)] = worker(rank, code);
    r.root_cause = static_cast<size_t>(rank);
    for (const auto& w : r.workers)
      if (hooks.on_worker_exit) hooks.on_worker_exit(w);
    if (hooks.on_local_failure) hooks.on_local_failure(r.workers[*r.root_cause]);
    return r;
  };
}
inline FakeWorkers::Script stopped_by(int sig) {
  return [=](FakeWorkers&, const AttemptHooks&) {
    AttemptResult r;
    r.workers = {worker(0, 128 + sig), worker(1, 128 + sig)};
    r.stop_signal = sig;
    return r;
  };
}
// A failure elsewhere reaches the watcher while the workers run.
inline FakeWorkers::Script stopped_by_remote(FakeMembership& m, FailureNotice notice) {
  return [&m, notice](FakeWorkers& w, const AttemptHooks&) {
    REQUIRE(m.watcher);
    m.watcher(notice);
    AttemptResult r;
    r.workers = {worker(0, 128 + SIGTERM), worker(1, 128 + SIGTERM)};
    r.remote = w.told_to_stop;
    return r;
  };
}

struct Job {
  ddprun::LaunchPlan plan;
  FakeWorkers workers;
  FakeMembership membership;
  ddprun::SummaryReports reports{plan};
  std::vector<std::string> summaries;

  Job() {
    plan.run_id = "run-7";
    plan.hostname = "hosta";
    plan.nproc = 2;
  }
  bool elastic = false;

  ddprun::JobPolicyOptions options(int max_restarts, bool hosts_store = true) {
    ddprun::JobPolicyOptions o;
    o.elastic = elastic;
    o.node_rank = kMe;
    o.hostname = plan.hostname;
    o.max_restarts = max_restarts;
    o.hosts_store = hosts_store;
    o.print = [this](const std::string& text) { summaries.push_back(text); };
    return o;
  }
  int run(int max_restarts, bool hosts_store = true) {
    return ddprun::JobPolicy(workers, membership, reports, options(max_restarts, hosts_store)).run();
  }
};

inline FailureNotice other_node_worker(int rank, int status) {
  return {1, rank, status, "hostb", "exited with code " + std::to_string(status), ddprun::NoticeKind::kWorker};
}

}  // namespace policy_fakes
