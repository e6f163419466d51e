// The job policy driven with fakes, no processes: which failure becomes the root
// cause, when a restart follows, what a stop signal does, and the exit status.
#include <catch2/catch.hpp>
#include <signal.h>

#include "job_adapters.hpp"
#include "job_policy_fakes.hpp"
#include "server_fixture.hpp"

using namespace policy_fakes;

TEST_CASE("a worker failure with restarts left starts a new attempt", "[job_policy]") {
  Job job;
  job.workers.attempts = {fail(1, 3), succeed()};
  CHECK(job.run(1) == 0);
  CHECK(job.workers.ran == std::vector<int>{0, 1});
  CHECK(job.workers.prepared == std::vector<int>{0, 1});
  REQUIRE(job.membership.published.size() == 1);
  CHECK(job.membership.published[0].node == kMe);
  CHECK(job.membership.published[0].rank == 1);
  CHECK(job.membership.published[0].status == 3);
  CHECK(job.membership.published[0].what == "exited with code 3");
  REQUIRE(job.summaries.size() == 1);
  CHECK_THAT(job.summaries[0], Catch::Contains("job run-7 (attempt 0) failed") &&
                                   Catch::Contains("Root cause (first worker to fail):") &&
                                   Catch::Contains("rank 1 (local_rank 1) on hosta"));
  CHECK(job.membership.barriers == std::vector<int>{1});  // the failed attempt never reached it
  // Left once, after the attempt that ended the job, lingering as the store's host.
  CHECK(job.membership.left == std::vector<std::pair<int, std::chrono::milliseconds>>{{1, 5s}});
  CHECK(job.membership.watches == 2);
  CHECK(job.membership.unwatches == 2);
}

TEST_CASE("a worker failure without restarts left ends the job with its status", "[job_policy]") {
  Job job;
  job.workers.attempts = {fail(0, 3)};
  CHECK(job.run(0, /*hosts_store=*/true) == 3);
  CHECK(job.workers.ran == std::vector<int>{0});
  CHECK(job.summaries.size() == 1);
  CHECK(job.membership.left == std::vector<std::pair<int, std::chrono::milliseconds>>{{0, 1s}});
  CHECK(job.membership.barriers.empty());

  Job guest;  // a node that does not host the store leaves at once
  guest.workers.attempts = {fail(0, 3)};
  CHECK(guest.run(0, /*hosts_store=*/false) == 3);
  CHECK(guest.membership.left == std::vector<std::pair<int, std::chrono::milliseconds>>{{0, 0s}});
}

TEST_CASE("the restart budget ends the job after max_restarts restarts", "[job_policy]") {
  Job job;
  job.workers.attempts = {fail(1, 5)};  // every attempt fails
  CHECK(job.run(2) == 5);
  CHECK(job.workers.ran == std::vector<int>{0, 1, 2});
  REQUIRE(job.summaries.size() == 3);
  CHECK_THAT(job.summaries[2], Catch::Contains("(attempt 2) failed"));
  CHECK(job.membership.published.size() == 3);
  CHECK(job.membership.left == std::vector<std::pair<int, std::chrono::milliseconds>>{{2, 1s}});
  CHECK(job.membership.ended.empty());  // end_job is for elastic jobs' waiting nodes
}

TEST_CASE("a lost node is not a worker failure: no restart", "[job_policy]") {
  Job job;
  FailureNotice lost{1, -1, 1, "hostb", "ddprun was lost (killed, crashed or cut off from the store) while the job ran",
                     ddprun::NoticeKind::kNodeLost};
  job.workers.attempts = {stopped_by_remote(job.membership, lost)};
  CHECK(job.run(3) == 1);
  CHECK(job.workers.ran == std::vector<int>{0});
  REQUIRE(job.workers.told_to_stop);
  CHECK(job.workers.told_to_stop->kind == ddprun::NoticeKind::kNodeLost);
  CHECK(job.membership.published.empty());  // the cause was not ours to publish
  REQUIRE(job.summaries.size() == 1);
  CHECK_THAT(job.summaries[0], Catch::Contains("Root cause (first failure in the job, on another node") &&
                                   Catch::Contains("node 1 (hostb): ddprun was lost") &&
                                   Catch::Contains("every node exits with status 1"));
}

TEST_CASE("a worker failure on another node restarts like a local one", "[job_policy]") {
  Job job;
  job.workers.attempts = {stopped_by_remote(job.membership, other_node_worker(5, 7)), succeed()};
  CHECK(job.run(1) == 0);
  CHECK(job.workers.ran == std::vector<int>{0, 1});
  REQUIRE(job.summaries.size() == 1);
  CHECK_THAT(job.summaries[0], Catch::Contains("rank 5 on node 1 (hostb): exited with code 7"));

  Job spent;
  spent.workers.attempts = {stopped_by_remote(spent.membership, other_node_worker(5, 7))};
  CHECK(spent.run(0) == 7);  // the remote root cause's status
}

TEST_CASE("a stop signal during the join publishes it and starts no worker", "[job_policy]") {
  Job job;
  job.membership.signal_during_join = SIGTERM;
  CHECK(job.run(3) == 128 + SIGTERM);
  CHECK(job.workers.ran.empty());
  CHECK(job.workers.prepared.empty());  // readied only once joined
  REQUIRE(job.membership.published.size() == 1);
  const FailureNotice& n = job.membership.published[0];
  CHECK(n.node == kMe);
  CHECK(n.rank == -1);
  CHECK(n.status == 128 + SIGTERM);
  CHECK(n.host == "hosta");
  CHECK(n.what == "ddprun received SIGTERM while joining the rendezvous");
  CHECK(job.membership.left == std::vector<std::pair<int, std::chrono::milliseconds>>{{0, 0s}});
  CHECK(job.membership.watches == 0);
  CHECK(job.summaries.empty());
}

TEST_CASE("a stop signal during the attempt ends the job without a restart", "[job_policy]") {
  Job job;
  job.workers.attempts = {stopped_by(SIGINT), succeed()};
  CHECK(job.run(3) == 128 + SIGINT);
  CHECK(job.workers.ran == std::vector<int>{0});
  REQUIRE(job.membership.published.size() == 1);
  CHECK(job.membership.published[0].rank == -1);
  CHECK(job.membership.published[0].status == 128 + SIGINT);
  CHECK(job.membership.published[0].what == "ddprun received SIGINT and stopped its workers");
  REQUIRE(job.summaries.size() == 1);
  // With other nodes, the published stop is the job's root cause.
  CHECK_THAT(job.summaries[0], Catch::Contains("stopped by SIGINT (signal 2) sent to ddprun") &&
                                   Catch::Contains("node 0 (hosta): ddprun received SIGINT and stopped its workers"));
  CHECK(job.membership.left == std::vector<std::pair<int, std::chrono::milliseconds>>{{0, 1s}});
}

TEST_CASE("on one node a stop signal is no remote root cause", "[job_policy]") {
  Job job;
  job.workers.attempts = {stopped_by(SIGTERM)};
  testing::ServerThread store;  // the store a single node hosts for its workers
  ddprun::JobLinkOptions link_options;
  link_options.host = "127.0.0.1";
  link_options.port = store.port();
  ddprun::JobLink link(link_options);
  ddprun::WorkerStore no_server(true, nullptr);  // the store above is not this test's to move
  ddprun::SingleNodeMembership alone(job.plan, link, no_server);
  CHECK(ddprun::JobPolicy(job.workers, alone, job.reports, job.options(3)).run() == 128 + SIGTERM);
  REQUIRE(job.summaries.size() == 1);
  CHECK_THAT(job.summaries[0], Catch::Contains("stopped by SIGTERM") && !Catch::Contains("Root cause") &&
                                   Catch::Contains("Workers:"));
  CHECK(alone.join(2).store.prefix == "attempt/2/pg/");
  CHECK(alone.join(0).world_size == 2);
}

TEST_CASE("every worker's exit is published as it is reaped, whatever its status", "[job_policy]") {
  Job job;
  job.workers.attempts = {fail(1, 3), [](FakeWorkers&, const AttemptHooks& hooks) {
                            AttemptResult r;
                            r.workers = {worker(0, 0), worker(1, 0)};
                            r.workers[1].wait_status = SIGKILL;  // killed by ddprun after the grace period
                            r.workers[1].ended = std::chrono::system_clock::time_point(std::chrono::milliseconds(1234));
                            for (const auto& w : r.workers) hooks.on_worker_exit(w);
                            return r;
                          }};
  CHECK(job.run(1) == 0);
  REQUIRE(job.membership.exits.size() == 4);
  const auto& [attempt0, failed] = job.membership.exits[1];
  CHECK(attempt0 == 0);
  CHECK(failed.rank == 1);
  CHECK(failed.exit_code == 3);
  CHECK(failed.signal == 0);
  CHECK(failed.pid == 1001);
  CHECK(failed.node_rank == kMe);
  CHECK(failed.host == "hosta");
  const auto& [attempt1, killed] = job.membership.exits[3];
  CHECK(attempt1 == 1);
  CHECK(killed.signal == SIGKILL);
  CHECK(killed.time_ms == 1234);
  CHECK(killed.describe() == "rank 1 was killed by signal 9 (SIGKILL) at " + ddp::contract::clock_time(1234) +
                                 " on node 0 (hosta)");
  CHECK(job.membership.exits[0].second.succeeded());
}

TEST_CASE("the exit barrier passes: status 0 and no summary", "[job_policy]") {
  Job job;
  job.workers.attempts = {succeed()};
  CHECK(job.run(2) == 0);
  CHECK(job.membership.barriers == std::vector<int>{0});
  CHECK(job.membership.published.empty());
  CHECK(job.summaries.empty());
  CHECK(job.membership.left == std::vector<std::pair<int, std::chrono::milliseconds>>{{0, 5s}});
}

TEST_CASE("the exit barrier reports a failure elsewhere: it becomes the root cause", "[job_policy]") {
  Job job;
  job.workers.attempts = {succeed()};
  job.membership.barrier_result = other_node_worker(9, 4);
  CHECK(job.run(0) == 4);
  REQUIRE(job.summaries.size() == 1);
  CHECK_THAT(job.summaries[0], Catch::Contains("rank 9 on node 1 (hostb): exited with code 4") &&
                                   Catch::Contains("This node's workers:"));
  CHECK(job.membership.left == std::vector<std::pair<int, std::chrono::milliseconds>>{{0, 1s}});

  Job lost;  // a node that never finished is no worker failure: no restart
  lost.workers.attempts = {succeed()};
  lost.membership.barrier_result = FailureNotice{kMe, -1, 1, "hosta", "exit barrier: node rank(s) 1 did not finish"};
  CHECK(lost.run(2) == 1);
  CHECK(lost.workers.ran == std::vector<int>{0});
}

TEST_CASE("the root cause is the first failure published, here or on another node", "[job_policy]") {
  SECTION("this node published first: its worker is the root cause") {
    Job job;
    job.workers.attempts = {fail(1, 3)};
    CHECK(job.run(0) == 3);
    REQUIRE(job.summaries.size() == 1);
    CHECK_THAT(job.summaries[0], Catch::Contains("Root cause (first worker to fail):") &&
                                     Catch::Contains("rank 1 (local_rank 1) on hosta, pid 1001: exited with code 3"));
  }
  SECTION("another node published first: its failure is the root cause and status") {
    Job job;
    job.membership.first_failure[0] = other_node_worker(4, 9);
    job.workers.attempts = {fail(1, 3)};
    CHECK(job.run(0) == 9);
    CHECK(job.membership.published.size() == 1);  // this node tried
    REQUIRE(job.summaries.size() == 1);
    CHECK_THAT(job.summaries[0], Catch::Contains("Root cause (first failure in the job, on another node") &&
                                     Catch::Contains("rank 4 on node 1 (hostb): exited with code 9") &&
                                     Catch::Contains("every node exits with status 9"));
  }
}

TEST_CASE("the watch stops before an exception from the attempt leaves the policy", "[job_policy]") {
  // The watch calls into the policy and its Workers: it must not outlive them.
  Job job;
  job.workers.attempts = {[](FakeWorkers&, const AttemptHooks&) -> AttemptResult {
    throw ddprun::LaunchError("the workers cannot be started");
  }};
  CHECK_THROWS_AS(job.run(0), ddprun::LaunchError);
  CHECK(job.membership.watches == 1);
  CHECK(job.membership.unwatches == 1);
  CHECK_FALSE(job.membership.watcher);
}

namespace {

// A watch that ends the job when the attempt's workers start, as the stall monitor
// does with --stall_action=stop.
class StoppingWatch : public ddprun::AttemptWatch {
 public:
  std::vector<int> started_attempts, ended_attempts;
  std::vector<pid_t> pids;
  void started(int attempt, const ddprun::JobLayout&, const std::vector<ddprun::WorkerOutcome>& workers,
               std::function<void(const ddprun::JobStop&)> stop_job) override {
    started_attempts.push_back(attempt);
    for (const auto& w : workers) pids.push_back(w.pid);
    stop_job({ddprun::kExitStalled, "stalled: rank 1 never arrived", "REPORT TEXT\n"});
  }
  void ended(int attempt) override { ended_attempts.push_back(attempt); }
};

}  // namespace

TEST_CASE("a watch's stop ends the job with its report as root cause, on every node, without a restart",
          "[job_policy]") {
  Job job;
  StoppingWatch watch;
  job.workers.attempts = {[](FakeWorkers& w, const AttemptHooks& hooks) {
    AttemptResult r;
    r.workers = {worker(0, 128 + SIGTERM), worker(1, 128 + SIGTERM)};
    REQUIRE(hooks.on_started);
    hooks.on_started(r.workers);
    r.remote = w.told_to_stop;
    return r;
  }};
  auto options = job.options(2);
  options.watches = {&watch};
  CHECK(ddprun::JobPolicy(job.workers, job.membership, job.reports, options).run() == ddprun::kExitStalled);
  CHECK(watch.started_attempts == std::vector<int>{0});
  CHECK(watch.ended_attempts == std::vector<int>{0});
  CHECK(watch.pids == std::vector<pid_t>{1000, 1001});
  REQUIRE(job.membership.published.size() == 1);
  CHECK(job.membership.published[0].rank == -1);
  CHECK(job.membership.published[0].status == ddprun::kExitStalled);
  CHECK(job.membership.published[0].what == "stalled: rank 1 never arrived");
  REQUIRE(job.summaries.size() == 1);
  CHECK_THAT(job.summaries[0], Catch::Contains("Root cause (ddprun stopped a stalled job, --stall_action=stop):\n"
                                               "REPORT TEXT\n  every node exits with status 124"));
  CHECK(job.workers.ran == std::vector<int>{0});  // restarts were left, but a stall is not restarted
}
