// The job policy of an elastic job (--nnodes MIN:MAX) driven with fakes: a lost
// node or failed worker re-forms the job while restarts are left, a node joining
// re-forms it without using one, a stop signal leaves the job to the others, and the
// job's end is told to nodes waiting to be admitted.
#include <catch2/catch.hpp>
#include <signal.h>

#include "job_policy_fakes.hpp"

using namespace policy_fakes;
using ddprun::NoticeKind;

namespace {

using Left = std::vector<std::pair<int, std::chrono::milliseconds>>;

// An attempt as the elastic membership hands it out.
ddprun::JobLayout attempt_layout(int attempt, int restart_count, int node_rank = kMe, int nnodes = 2) {
  ddprun::JobLayout l;
  l.attempt = attempt;
  l.restart_count = restart_count;
  l.node_rank = node_rank;
  l.nnodes = nnodes;
  l.world_size = 2 * nnodes;
  return l;
}

FailureNotice lost_node(int node) {
  return {node, -1, 1, "hostb", "ddprun was lost (killed, crashed or cut off from the store) while the job ran",
          NoticeKind::kNodeLost};
}

FailureNotice grow(int node) { return {node, -1, 0, "hostc", "joins the job", NoticeKind::kGrow}; }

struct ElasticJob : Job {
  ElasticJob() { elastic = true; }
};

}  // namespace

TEST_CASE("elastic: a lost node uses a restart and the job re-forms in the attempt join returns",
          "[job_policy][elastic]") {
  ElasticJob job;
  job.membership.layouts = {attempt_layout(0, 0, kMe, 3), attempt_layout(1, 1, kMe, 2)};
  job.workers.attempts = {stopped_by_remote(job.membership, lost_node(2)), succeed()};
  CHECK(job.run(1, /*hosts_store=*/false) == 0);
  CHECK(job.membership.joins == std::vector<int>{0, 1});
  CHECK(job.workers.prepared == std::vector<int>{0, 1});
  CHECK(job.workers.ran == std::vector<int>{0, 1});
  REQUIRE(job.workers.layouts.size() == 2);
  CHECK(job.workers.layouts[1].nnodes == 2);  // the workers get the smaller world
  CHECK(job.membership.published.empty());   // the lost node's will said it
  REQUIRE(job.summaries.size() == 1);
  CHECK_THAT(job.summaries[0], Catch::Contains("(attempt 0) failed") && Catch::Contains("node 2 (hostb): ddprun was lost"));
  // It goes on, and its summary says so rather than that every node exits.
  CHECK_THAT(job.summaries[0],
             Catch::Contains("this node goes on: re-forming the job without the lost node (restart 1 of 1)") &&
                 !Catch::Contains("every node exits"));
  // Finished: nodes waiting to be admitted hear the job is over.
  CHECK(job.membership.ended == std::vector<std::tuple<int, int, std::string>>{{1, 0, "the job finished"}});
  CHECK(job.membership.left == Left{{1, 0s}});
}

TEST_CASE("elastic: a worker failure here re-forms the job like a lost node", "[job_policy][elastic]") {
  ElasticJob job;
  job.membership.layouts = {attempt_layout(0, 0), attempt_layout(1, 1)};
  job.workers.attempts = {fail(1, 3), succeed()};
  CHECK(job.run(2) == 0);
  CHECK(job.workers.ran == std::vector<int>{0, 1});
  REQUIRE(job.membership.published.size() == 1);
  CHECK(job.membership.published[0].kind == NoticeKind::kWorker);
  CHECK(job.membership.published[0].rank == 1);
  CHECK_THAT(job.summaries.at(0), Catch::Contains("Root cause (first worker to fail):"));
}

TEST_CASE("elastic: with the restarts spent the job ends with end_job and the root cause's status",
          "[job_policy][elastic]") {
  SECTION("a lost node after one restart") {
    ElasticJob job;
    job.membership.layouts = {attempt_layout(0, 0), attempt_layout(1, 1)};
    job.workers.attempts = {stopped_by_remote(job.membership, lost_node(1))};  // every attempt
    CHECK(job.run(1) == 1);
    CHECK(job.workers.ran == std::vector<int>{0, 1});
    REQUIRE(job.summaries.size() == 2);
    CHECK_THAT(job.summaries[0], Catch::Contains("this node goes on: re-forming") && !Catch::Contains("every node exits"));
    CHECK_THAT(job.summaries[1], Catch::Contains("every node exits with status 1") && !Catch::Contains("goes on"));
    REQUIRE(job.membership.ended.size() == 1);
    CHECK(std::get<0>(job.membership.ended[0]) == 1);
    CHECK(std::get<1>(job.membership.ended[0]) == 1);
    CHECK_THAT(std::get<2>(job.membership.ended[0]), Catch::Contains("--max_restarts=1"));
    CHECK(job.membership.left == Left{{1, 1s}});  // after end_job, lingering as the store's host
  }
  SECTION("the budget counts the job's restarts (layout.restart_count), not this node's attempts") {
    // A newcomer that joined at attempt 4 of a job that already restarted twice.
    ElasticJob job;
    job.membership.layouts = {attempt_layout(4, 2)};
    job.workers.attempts = {fail(0, 3)};
    CHECK(job.run(2) == 3);  // the local root cause's status
    CHECK(job.workers.ran == std::vector<int>{4});
    CHECK(job.membership.ended.size() == 1);
    CHECK(std::get<1>(job.membership.ended.at(0)) == 3);
  }
}

TEST_CASE("elastic: a node joining re-forms the job and never uses a restart", "[job_policy][elastic]") {
  ElasticJob job;
  job.membership.layouts = {attempt_layout(0, 0), attempt_layout(1, 0, kMe, 3), attempt_layout(2, 0, kMe, 4),
                            attempt_layout(3, 0, kMe, 5)};
  job.workers.attempts = {stopped_by_remote(job.membership, grow(2)), stopped_by_remote(job.membership, grow(3)),
                          stopped_by_remote(job.membership, grow(4)), succeed()};
  CHECK(job.run(0) == 0);  // no restart allowed, yet three re-formings
  CHECK(job.workers.ran == std::vector<int>{0, 1, 2, 3});
  CHECK_FALSE(job.workers.told_to_stop);  // the last run was not stopped
  CHECK(job.summaries.empty());  // a grow is no failure
  CHECK(job.membership.published.empty());
  CHECK(job.membership.barriers == std::vector<int>{3});
  CHECK(job.membership.left == Left{{3, 5s}});
}

TEST_CASE("elastic: a newcomer starts in the attempt it joined, under its rank there", "[job_policy][elastic]") {
  ElasticJob job;
  job.membership.layouts = {attempt_layout(5, 1, /*node_rank=*/2, 3), attempt_layout(6, 2, 1, 2)};
  job.workers.attempts = {fail(1, 3), succeed()};
  CHECK(job.run(3) == 0);
  CHECK(job.membership.joins == std::vector<int>{0, 6});  // asked for 0, then the one after 5
  CHECK(job.workers.prepared == std::vector<int>{5, 6});
  CHECK(job.workers.ran == std::vector<int>{5, 6});
  REQUIRE(job.membership.published.size() == 1);
  CHECK(job.membership.published[0].node == 2);  // notices name the rank in the attempt
  REQUIRE(job.membership.exits.size() == 2);  // (the second attempt's script publishes none)
  CHECK(job.membership.exits[1].first == 5);
  CHECK(job.membership.exits[1].second.node_rank == 2);
  CHECK(job.workers.layouts.at(1).node_rank == 1);
  CHECK_THAT(job.summaries.at(0), Catch::Contains("(attempt 5) failed"));
  CHECK(job.membership.barriers == std::vector<int>{6});
}

TEST_CASE("elastic: a job that ended without this node ends it with the job's status", "[job_policy][elastic]") {
  ElasticJob job;
  job.membership.over = ddprun::JobOver{3, "the job ended (status 3) before this node was admitted"};
  job.workers.attempts = {succeed()};
  CHECK(job.run(2) == 3);
  CHECK(job.workers.prepared.empty());
  CHECK(job.workers.ran.empty());
  CHECK(job.membership.published.empty());
  CHECK(job.membership.ended.empty());
  CHECK(job.summaries.empty());
}

TEST_CASE("elastic: a stop signal leaves the job to the others with a lost-node notice", "[job_policy][elastic]") {
  SECTION("while the workers run") {
    ElasticJob job;
    job.membership.layouts = {attempt_layout(0, 0, /*node_rank=*/1, 3)};
    job.workers.attempts = {stopped_by(SIGTERM), succeed()};
    CHECK(job.run(3, /*hosts_store=*/false) == 128 + SIGTERM);
    CHECK(job.workers.ran == std::vector<int>{0});  // restarts left, but this node is gone
    REQUIRE(job.membership.published.size() == 1);
    const FailureNotice& n = job.membership.published[0];
    CHECK(n.kind == NoticeKind::kNodeLost);
    CHECK(n.node == 1);
    CHECK(n.rank == -1);
    CHECK(n.status == 128 + SIGTERM);
    CHECK(n.what == "ddprun received SIGTERM and left the job");
    CHECK(job.membership.ended.empty());  // the job goes on without this node
    CHECK(job.membership.left == Left{{0, 0s}});
    CHECK(job.summaries.size() == 1);
  }
  SECTION("after another node's failure: still 128+signal, the job goes on without it") {
    ElasticJob job;
    job.membership.first_failure[0] = lost_node(2);
    job.workers.attempts = {stopped_by(SIGTERM)};
    CHECK(job.run(3, /*hosts_store=*/false) == 128 + SIGTERM);
    CHECK(job.membership.published.size() == 1);  // it tried; the lost node was first
    CHECK(job.membership.ended.empty());
    CHECK(job.membership.left == Left{{0, 0s}});
  }
  SECTION("while joining: it only leaves, ending no attempt") {
    ElasticJob job;
    job.membership.signal_during_join = SIGINT;
    CHECK(job.run(3) == 128 + SIGINT);
    CHECK(job.membership.published.empty());
    CHECK(job.membership.ended.empty());
    CHECK(job.membership.left == Left{{0, 0s}});
    CHECK(job.workers.prepared.empty());
  }
}

TEST_CASE("elastic: a lost store or a stop ends the job whatever the restarts", "[job_policy][elastic]") {
  SECTION("the store is lost: no end_job (nothing left to tell it)") {
    ElasticJob job;
    FailureNotice gone{0, -1, 1, "hosta", "lost the store on node 0; a ddp-rendezvous daemon (--rdzv_endpoint) "
                                          "lets the job survive that", NoticeKind::kStoreLost};
    job.workers.attempts = {stopped_by_remote(job.membership, gone), succeed()};
    CHECK(job.run(3, /*hosts_store=*/false) == 1);
    CHECK(job.workers.ran == std::vector<int>{0});
    CHECK(job.membership.ended.empty());
    CHECK(job.membership.left == Left{{0, 0s}});
    CHECK_THAT(job.summaries.at(0), Catch::Contains("ddp-rendezvous daemon"));
  }
  SECTION("a stop (exit barrier timeout, stall stop) ends the job for waiting nodes too") {
    ElasticJob job;
    job.workers.attempts = {succeed()};
    job.membership.barrier_result = FailureNotice{1, -1, 1, "hostb", "exit barrier: node rank(s) 1 did not finish"};
    CHECK(job.run(3) == 1);
    CHECK(job.workers.ran == std::vector<int>{0});
    REQUIRE(job.membership.ended.size() == 1);
    CHECK(std::get<1>(job.membership.ended[0]) == 1);
  }
}

TEST_CASE("elastic: a grow from the exit barrier after success re-forms the job", "[job_policy][elastic]") {
  ElasticJob job;
  job.membership.layouts = {attempt_layout(0, 0), attempt_layout(1, 0, kMe, 3)};
  job.membership.barrier_result = grow(2);
  // The barrier says grow once; the next attempt's barrier passes.
  job.workers.attempts = {[&](FakeWorkers&, const AttemptHooks&) {
                            AttemptResult r;
                            r.workers = {worker(0, 0), worker(1, 0)};
                            return r;
                          },
                          [&](FakeWorkers&, const AttemptHooks&) {
                            job.membership.barrier_result.reset();
                            AttemptResult r;
                            r.workers = {worker(0, 0), worker(1, 0)};
                            return r;
                          }};
  CHECK(job.run(0) == 0);
  CHECK(job.workers.ran == std::vector<int>{0, 1});
  CHECK(job.membership.barriers == std::vector<int>{0, 1});
  CHECK(job.summaries.empty());
  CHECK(job.membership.ended == std::vector<std::tuple<int, int, std::string>>{{1, 0, "the job finished"}});
  CHECK(job.membership.left == Left{{1, 5s}});
}

// The membership settles a local worker's failure as kStop when another node finished
// first (the store says so for every node): this node must end the job too, not re-form
// it while the others end.
TEST_CASE("elastic: a local worker failure after another node finished ends the job", "[job_policy][elastic]") {
  ElasticJob job;
  job.membership.layouts = {attempt_layout(0, 0), attempt_layout(1, 1)};
  job.membership.first_failure[0] = {kMe, 1, 3, "hosta", "exited with code 3", NoticeKind::kStop};
  job.workers.attempts = {fail(1, 3), succeed()};
  CHECK(job.run(2) == 3);
  CHECK(job.workers.ran == std::vector<int>{0});
  REQUIRE(job.membership.ended.size() == 1);
  CHECK(std::get<1>(job.membership.ended[0]) == 3);
  CHECK_THAT(job.summaries.at(0), Catch::Contains("Root cause (first worker to fail):"));
}

// The node hosting the store must not take it away before the nodes still waiting read
// the job's end: every way out of a join leaves, with the store host's linger.
TEST_CASE("elastic: a join that ends the job leaves the membership, lingering on the store's host",
          "[job_policy][elastic]") {
  ElasticJob job;
  SECTION("JobOver") {
    job.membership.over = ddprun::JobOver{1, "the job ended before this node was admitted"};
    CHECK(job.run(0) == 1);
  }
  SECTION("giving up below MIN") {
    job.membership.layouts.clear();
    job.workers.attempts = {succeed()};
    struct GivesUp : FakeMembership {
      ddprun::JobLayout join(int attempt) override {
        joins.push_back(attempt);
        throw ddprun::LaunchError("rendezvous: the job needs at least 3 nodes; 2 present");
      }
    };
    GivesUp m;
    CHECK_THROWS_AS(ddprun::JobPolicy(job.workers, m, job.reports, job.options(0)).run(), ddprun::LaunchError);
    job.membership.left = m.left;
  }
  CHECK(job.workers.ran.empty());
  CHECK(job.membership.left == Left{{0, 1s}});
}
