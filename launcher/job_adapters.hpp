// The job policy's interfaces (job/) over ddprun's real pieces: the Supervisor as
// Workers, the RendezvousAgent as Membership, the membership of a job that has one
// node only, and the failure summary as FailureReports. Part of the composition
// root (with main.cpp): it depends on every folder, and no folder includes it.
#pragma once

#include "job/failure_reports.hpp"
#include "job/membership.hpp"
#include "job/workers.hpp"
#include "membership/rendezvous_agent.hpp"
#include "plan/launch_plan.hpp"
#include "store/job_link.hpp"
#include "store/worker_store.hpp"
#include "supervise/supervisor.hpp"

namespace ddprun {

class SupervisorWorkers : public Workers {
 public:
  // `joins_others`: attempt 0's log folders wait for the run id the nodes agree on
  // (prepare_launch made them when the run id was already known).
  SupervisorWorkers(Supervisor& supervisor, const LaunchPlan& plan, bool joins_others)
      : supervisor_(supervisor), plan_(plan), joins_others_(joins_others) {}

  void prepare(int attempt) override;
  AttemptResult run(int attempt, const JobLayout& layout, const AttemptHooks& hooks) override {
    return supervisor_.run_attempt(attempt, layout, hooks);
  }
  void stop_for_remote(int attempt, RemoteCause cause) override {
    supervisor_.stop_for_remote(attempt, std::move(cause));
  }

 private:
  Supervisor& supervisor_;
  const LaunchPlan& plan_;
  bool joins_others_;
};

class AgentMembership : public Membership {
 public:
  explicit AgentMembership(RendezvousAgent& agent) : agent_(agent) {}

  JobLayout join(int attempt) override { return agent_.join(attempt); }
  void start_watch(int attempt, std::function<void(const FailureNotice&)> on_failure) override {
    agent_.start_watch(attempt, std::move(on_failure));
  }
  void stop_watch() override { agent_.stop_watch(); }
  std::optional<FailureNotice> publish_failure(int attempt, const FailureNotice& notice) override {
    return agent_.publish_failure(attempt, notice);
  }
  void publish_exit(int attempt, const ddp::contract::ExitRecord& record) override {
    agent_.publish_exit(attempt, record);
  }
  std::optional<FailureNotice> exit_barrier(int attempt) override { return agent_.exit_barrier(attempt); }
  void leave(int attempt, std::chrono::milliseconds linger) override { agent_.leave(attempt, linger); }
  void end_job(int, int status, const std::string& why) override { agent_.end_job(status, why); }

 private:
  RendezvousAgent& agent_;
};

// One node, and the store it hosts for its workers on loopback: no other node to
// tell; worker exits go to that store for the workers to see.
class SingleNodeMembership : public Membership {
 public:
  // `link`: this ddprun's link to the store it hosts; it must outlive this.
  // `worker_store` serves the workers' torch clients on MASTER_PORT; it must outlive this.
  SingleNodeMembership(const LaunchPlan& plan, JobLink& link, WorkerStore& worker_store)
      : plan_(plan), link_(link), worker_store_(worker_store) {}

  JobLayout join(int attempt) override;
  void start_watch(int, std::function<void(const FailureNotice&)>) override {}
  void stop_watch() override {}
  std::optional<FailureNotice> publish_failure(int, const FailureNotice&) override { return std::nullopt; }
  void publish_exit(int attempt, const ddp::contract::ExitRecord& record) override {
    link_.publish_exit(attempt, record);
  }
  std::optional<FailureNotice> exit_barrier(int) override { return std::nullopt; }
  void leave(int, std::chrono::milliseconds) override {}

 private:
  const LaunchPlan& plan_;
  JobLink& link_;
  WorkerStore& worker_store_;
};

// The failure summary of diagnose/summary.hpp and the workers' error files
// (supervise/error_files.hpp).
class SummaryReports : public FailureReports {
 public:
  // `plan` names the job in summaries; it must outlive this.
  explicit SummaryReports(const LaunchPlan& plan) : plan_(plan) {}

  std::string failure_summary(const AttemptResult& result, int attempt, const std::string& next) const override;
  std::string incomplete_logs(const AttemptResult& result) const override;
  std::string worker_exception(const WorkerOutcome& worker) const override;

 private:
  const LaunchPlan& plan_;
};

}  // namespace ddprun
