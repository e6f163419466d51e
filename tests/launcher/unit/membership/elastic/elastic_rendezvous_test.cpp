// The elastic rendezvous (--nnodes MIN:MAX) of real RendezvousAgents, each on its own
// store connection, against a real store server on loopback: forming, re-forming
// after lost nodes, growing, the closing lock, the job's end and stop signals. A node
// is "lost" by destroying its agent without leave(): its connection drops and the
// server fires its wills, as when a ddprun is killed.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include "ddp/contract/store_keys.hpp"
#include "errors.hpp"
#include "job/job_over.hpp"
#include "membership/rendezvous_agent.hpp"
#include "server_fixture.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ddp::contract::JobKeys;
using ddprun::FailureNotice;
using ddprun::JobLayout;
using ddprun::NoticeKind;

namespace {

struct NodeSpec {
  int min = 2;
  int max = 3;
  int hint = -1;              // -1: no --node_rank
  double last_call = 0.3;
  double join_timeout = 20;
  int max_restarts = 3;       // re-forming after a failure needs one left
};

// One node's ddprun, as far as the rendezvous goes.
struct Node {
  ddprun::LaunchPlan plan;
  std::atomic<int> stop{0};
  // Hosts no job store: it offers a torch-only store of its own as MASTER_PORT.
  ddprun::WorkerStore worker_store{true, nullptr};
  std::unique_ptr<ddprun::JobLink> link;
  std::unique_ptr<ddprun::RendezvousAgent> agent;

  Node(const testing::ServerThread& server, const std::string& host, const NodeSpec& s) {
    plan.options.min_nodes = s.min;
    plan.options.nnodes = s.max;
    plan.options.node_rank = s.hint < 0 ? 0 : s.hint;
    plan.options.node_rank_given = s.hint >= 0;
    plan.options.last_call_timeout = s.last_call;
    plan.options.join_timeout = s.join_timeout;
    plan.options.max_restarts = s.max_restarts;
    plan.options.heartbeat_timeout = 3;
    plan.options.exit_barrier_timeout = 10;
    plan.hostname = host;
    plan.nproc = 2;
    ddprun::JobLinkOptions o;
    o.host = "127.0.0.1";
    o.port = server.port();
    o.heartbeat_timeout = ddprun::to_ms(plan.options.heartbeat_timeout);
    link = std::make_unique<ddprun::JobLink>(o);
    agent = std::make_unique<ddprun::RendezvousAgent>(plan, *link, worker_store, [this] { return stop.load(); });
  }
  std::future<JobLayout> join(int attempt) {
    return std::async(std::launch::async, [this, attempt] { return agent->join(attempt); });
  }
};

std::vector<JobLayout> join_all(const std::vector<Node*>& nodes, int attempt) {
  std::vector<std::future<JobLayout>> joins;
  for (Node* n : nodes) joins.push_back(n->join(attempt));
  std::vector<JobLayout> out;
  for (auto& j : joins) out.push_back(j.get());
  return out;
}

// Two nodes at 2:3 running attempt 0 on their own store server; `store` looks on.
struct TwoRunning {
  testing::ServerThread server;
  std::unique_ptr<rdzv::TcpStore> store = server.client();
  Node a{server, "a", NodeSpec{}};
  Node b{server, "b", NodeSpec{}};
  std::vector<JobLayout> first = join_all({&a, &b}, 0);
};

FailureNotice failure_of(rdzv::Store& store, int attempt) {
  return FailureNotice::decode(store.get(JobKeys(attempt).failure(), 10s));
}

// The join ends with JobOver (a Catch failure when it joins instead).
ddprun::JobOver job_over(std::future<JobLayout>& joining) {
  try {
    joining.get();
  } catch (const ddprun::JobOver& over) {
    return over;
  }
  FAIL("joined a job that ended");
  return {};
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

TEST_CASE("elastic: MAX nodes form the first attempt at once, ranks by hint then arrival", "[elastic_rdzv]") {
  testing::ServerThread server;
  NodeSpec s;
  s.last_call = 30;  // never waited for: MAX is there
  Node a(server, "a", {s.min, s.max, 2}), b(server, "b", s), c(server, "c", {s.min, s.max, 0});
  const auto start = Clock::now();
  auto layouts = join_all({&a, &b, &c}, 0);
  CHECK(seconds_since(start) < 8);
  // c (hint 0), a (hint 2), b (no hint).
  CHECK(layouts[2].node_rank == 0);
  CHECK(layouts[0].node_rank == 1);
  CHECK(layouts[1].node_rank == 2);
  for (const auto& l : layouts) {
    CHECK(l.attempt == 0);
    CHECK(l.nnodes == 3);
    CHECK(l.world_size == 6);
    CHECK(l.restart_count == 0);
    CHECK(l.rank_offset == 2 * l.node_rank);
    CHECK(l.master_port == layouts[2].master_port);
    CHECK(l.master_addr == "127.0.0.1");
    CHECK(l.store.prefix == JobKeys(0).process_groups());
  }
  // MASTER_PORT: member 0's (c's) torch-only store, listening for the workers.
  CHECK(layouts[2].master_port == c.worker_store.offer_port("127.0.0.1"));
}

TEST_CASE("elastic: MIN nodes form the first attempt after the last call, not before", "[elastic_rdzv]") {
  testing::ServerThread server;
  NodeSpec s;
  s.last_call = 1.0;
  Node a(server, "a", s), b(server, "b", s);
  const auto start = Clock::now();
  auto layouts = join_all({&a, &b}, 0);
  const double took = seconds_since(start);
  CHECK(took >= 0.9);
  CHECK(took < 8);
  CHECK(layouts[0].nnodes == 2);
  CHECK(layouts[0].node_rank != layouts[1].node_rank);
}

TEST_CASE("elastic: survivors re-form at once without a lost node, keeping their order", "[elastic_rdzv]") {
  testing::ServerThread server;
  auto store = server.client();
  NodeSpec s;
  s.last_call = 30;  // a later attempt must not wait for it
  auto a = std::make_unique<Node>(server, "a", s);
  auto b = std::make_unique<Node>(server, "b", s);
  auto c = std::make_unique<Node>(server, "c", s);
  auto first = join_all({a.get(), b.get(), c.get()}, 0);
  REQUIRE(first[1].node_rank == 1);

  b.reset();  // killed: its wills fire
  CHECK(failure_of(*store, 0).kind == NoticeKind::kNodeLost);
  const auto start = Clock::now();
  auto second = join_all({a.get(), c.get()}, 1);
  CHECK(seconds_since(start) < 5);
  CHECK(second[0].attempt == 1);
  CHECK(second[0].nnodes == 2);
  CHECK(second[0].node_rank == 0);  // a stays before c
  CHECK(second[1].node_rank == 1);
  CHECK(second[0].restart_count == 1);  // a lost node uses a restart
  CHECK(second[0].world_size == 4);
}

TEST_CASE("elastic: two nodes lost at once are both left out", "[elastic_rdzv]") {
  testing::ServerThread server;
  NodeSpec s{2, 4, -1, 30, 20};
  std::vector<std::unique_ptr<Node>> nodes;
  for (const char* h : {"a", "b", "c", "d"}) nodes.push_back(std::make_unique<Node>(server, h, s));
  join_all({nodes[0].get(), nodes[1].get(), nodes[2].get(), nodes[3].get()}, 0);
  nodes[1].reset();
  nodes[2].reset();
  const auto start = Clock::now();
  auto second = join_all({nodes[0].get(), nodes[3].get()}, 1);
  CHECK(seconds_since(start) < 5);
  CHECK(second[0].nnodes == 2);
  CHECK(second[0].node_rank == 0);
  CHECK(second[1].node_rank == 1);
}

TEST_CASE("elastic: a newcomer below MAX ends the running attempt (grow) and is admitted", "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  NodeSpec s;
  REQUIRE(first[0].nnodes == 2);

  Node c(server, "c", s);
  auto joining = c.join(0);
  const auto grow = failure_of(*store, 0);
  CHECK(grow.kind == NoticeKind::kGrow);
  CHECK(grow.what.find("node c joins") != std::string::npos);
  // The running nodes see it and re-form with the newcomer.
  auto second = join_all({&a, &b}, 1);
  const JobLayout mine = joining.get();
  CHECK(mine.attempt == 1);
  CHECK(mine.node_rank == 2);  // after the stayers
  CHECK(mine.nnodes == 3);
  CHECK(second[0].node_rank == first[0].node_rank);
  CHECK(second[1].node_rank == first[1].node_rank);
  CHECK(mine.restart_count == 0);  // a grow uses no restart
  CHECK(second[0].restart_count == 0);
  CHECK(mine.master_port == second[0].master_port);
}

TEST_CASE("elastic: a newcomer at MAX waits without ending the attempt, then hears the job's end",
          "[elastic_rdzv]") {
  testing::ServerThread server;
  auto store = server.client();
  NodeSpec s{1, 2, -1, 0.3, 20};
  Node a(server, "a", s), b(server, "b", s);
  join_all({&a, &b}, 0);
  Node c(server, "c", s);
  auto joining = c.join(0);
  CHECK(joining.wait_for(1s) == std::future_status::timeout);
  CHECK_FALSE(store->check({JobKeys(0).failure()}));
  a.agent->end_job(0, "the workers all succeeded");
  const auto over = job_over(joining);
  CHECK(over.status == 0);
  CHECK(over.message.find("the workers all succeeded") != std::string::npos);
}

TEST_CASE("elastic: once a node finished, a newcomer cannot re-form the attempt", "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  NodeSpec s;
  auto barrier_a = std::async(std::launch::async, [&] { return a.agent->exit_barrier(0); });
  auto barrier_b = std::async(std::launch::async, [&] { return b.agent->exit_barrier(0); });
  CHECK_FALSE(barrier_a.get().has_value());
  CHECK_FALSE(barrier_b.get().has_value());
  CHECK(store->get(JobKeys(0).closing(), 1s) == "finished");

  Node c(server, "c", s);
  auto joining = c.join(0);
  CHECK(joining.wait_for(1s) == std::future_status::timeout);
  CHECK_FALSE(store->check({JobKeys(0).failure()}));  // no grow
  // A node lost now ends the finishing job rather than re-forming it.
  auto lost = b.agent->publish_failure(0, {1, -1, 1, "b", "lost", NoticeKind::kNodeLost});
  CHECK(lost.kind == NoticeKind::kStop);
  b.agent->end_job(0, "done");
  CHECK(job_over(joining).message.find("done") != std::string::npos);
}

TEST_CASE("elastic: a newcomer that asks first wins the closing key over a finishing node", "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  NodeSpec s;
  Node c(server, "c", s);
  auto joining = c.join(0);
  REQUIRE(failure_of(*store, 0).kind == NoticeKind::kGrow);
  auto notice = a.agent->exit_barrier(0);
  REQUIRE(notice);
  CHECK(notice->kind == NoticeKind::kGrow);
  join_all({&a, &b}, 1);
  CHECK(joining.get().nnodes == 3);
}

TEST_CASE("elastic: below MIN for join_timeout ends the job with counts, and a waiter hears it", "[elastic_rdzv]") {
  testing::ServerThread server;
  Node quick(server, "quick", {3, 4, -1, 0.3, 1.5});
  Node patient(server, "patient", {3, 4, -1, 0.3, 60});
  auto waiting = patient.join(0);
  const auto start = Clock::now();
  try {
    quick.agent->join(0);
    FAIL("formed with too few nodes");
  } catch (const ddprun::LaunchError& e) {
    const std::string what = e.what();
    CHECK(what.find("needs at least 3 nodes; 2 present") != std::string::npos);
    CHECK(what.find("patient") != std::string::npos);
  }
  CHECK(seconds_since(start) < 8);
  const auto over = job_over(waiting);
  CHECK(over.status == 1);
  CHECK(over.message.find("needs at least 3 nodes") != std::string::npos);
}

TEST_CASE("elastic: a stop signal ends the wait with Interrupted", "[elastic_rdzv]") {
  testing::ServerThread server;
  Node a(server, "a", {2, 3, -1, 0.3, 60});
  auto waiting = a.join(0);
  CHECK(waiting.wait_for(300ms) == std::future_status::timeout);
  const auto start = Clock::now();
  a.stop = 15;
  try {
    waiting.get();
    FAIL("joined alone");
  } catch (const ddprun::Interrupted& stop) {
    CHECK(stop.signal == 15);
  }
  CHECK(seconds_since(start) < 2);
}

// A newcomer that took the closing key ("grow <id>") and died before it wrote the
// attempt's failure: the attempt must still end in the store, or the nodes that pass
// the exit barrier would wait for it forever in the next join.
TEST_CASE("elastic: a grow whose newcomer died is finished by the exit barrier", "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  REQUIRE(store->compare_set(JobKeys(0).closing(), "", "grow 99") == "grow 99");
  auto barrier_a = std::async(std::launch::async, [&] { return a.agent->exit_barrier(0); });
  auto barrier_b = std::async(std::launch::async, [&] { return b.agent->exit_barrier(0); });
  for (auto* barrier : {&barrier_a, &barrier_b}) {
    REQUIRE(barrier->wait_for(8s) == std::future_status::ready);
    auto notice = barrier->get();
    REQUIRE(notice);
    CHECK(notice->kind == NoticeKind::kGrow);
  }
  CHECK(failure_of(*store, 0).kind == NoticeKind::kGrow);  // in the store, not only locally
  auto reforming = std::async(std::launch::async, [&] { return join_all({&a, &b}, 1); });
  REQUIRE(reforming.wait_for(8s) == std::future_status::ready);
  auto second = reforming.get();
  CHECK(second[0].attempt == 1);
  CHECK(second[0].nnodes == 2);
  CHECK(second[0].restart_count == 0);  // a grow uses no restart
}

TEST_CASE("elastic: a newcomer finishes another newcomer's grow that was left half done", "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  REQUIRE(store->compare_set(JobKeys(0).closing(), "", "grow 99") == "grow 99");
  Node c(server, "c", NodeSpec{});
  auto joining = c.join(0);
  CHECK(failure_of(*store, 0).kind == NoticeKind::kGrow);
  auto second = join_all({&a, &b}, 1);
  REQUIRE(joining.wait_for(8s) == std::future_status::ready);
  CHECK(joining.get().nnodes == 3);
  CHECK(second[0].nnodes == 3);
}

// A member marked lost whose failure will never fired (lost between the closing and
// setting its will): the others' watchers end the attempt for it.
TEST_CASE("elastic: a member marked lost without a failure notice ends the attempt via the watch",
          "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  const auto members = ddprun::elastic::MemberList::decode(store->get(JobKeys(0).members(), 1s));
  std::promise<FailureNotice> seen;
  a.agent->start_watch(0, [&](const FailureNotice& n) { seen.set_value(n); });
  store->set(JobKeys::elastic_lost(members.ids[1]), "1");
  const auto start = Clock::now();
  auto heard = seen.get_future();
  REQUIRE(heard.wait_for(8s) == std::future_status::ready);
  CHECK(seconds_since(start) < 4);  // heartbeat_timeout is 3 s: a quarter of it per look
  const auto notice = heard.get();
  CHECK(notice.kind == NoticeKind::kNodeLost);
  CHECK(notice.node == 1);
  CHECK(notice.host == "b");
  a.agent->stop_watch();
  CHECK(failure_of(*store, 0).kind == NoticeKind::kNodeLost);  // for every node, not only a
}

// A node stopped (SIGTERM) in its join just as another node closed the attempt with it:
// the attempt is ended for it, or the others would start workers sized for it.
TEST_CASE("elastic: a node that leaves its join after being closed into an attempt ends that attempt",
          "[elastic_rdzv]") {
  testing::ServerThread server;
  auto store = server.client();
  NodeSpec s;
  s.last_call = 30;
  Node a(server, "a", s);  // id 1
  Node b(server, "b", s);  // id 2
  auto joining = a.join(0);
  store->wait({JobKeys(0).member(1)}, 8s);  // a registered
  ddprun::elastic::Registration reg;
  reg.host = "b";
  reg.address = "127.0.0.1";
  reg.port = 1234;
  store->set(JobKeys(0).member(2), reg.encode());
  ddprun::elastic::MemberList list;
  list.ids = {1, 2};
  store->set(JobKeys(0).members(), list.encode());  // as if a third node closed it
  REQUIRE(joining.wait_for(8s) == std::future_status::ready);
  CHECK(joining.get().nnodes == 2);
  b.stop = 15;
  CHECK_THROWS_AS(b.agent->join(0), ddprun::Interrupted);
  const auto notice = failure_of(*store, 0);
  CHECK(notice.kind == NoticeKind::kNodeLost);
  CHECK(notice.node == 1);
  CHECK(notice.host == "b");
}

// A worker fails on one node while another passes its exit barrier: whichever came
// first in the store, both nodes must decide alike (re-form, or end the job).
TEST_CASE("elastic: a failure before a node finished is read alike by the failing and the finishing node",
          "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  const auto failed = b.agent->publish_failure(0, {first[1].node_rank, 3, 3, "b", "exited with code 3",
                                                   NoticeKind::kWorker});
  CHECK(failed.kind == NoticeKind::kWorker);  // nobody had finished: a restart may follow
  auto barrier = a.agent->exit_barrier(0);    // a's workers succeed just after
  REQUIRE(barrier);
  CHECK(barrier->kind == NoticeKind::kWorker);  // not kStop: the failure came first
}

TEST_CASE("elastic: a failure after a node finished ends the job on both nodes", "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  auto barrier = std::async(std::launch::async, [&] { return a.agent->exit_barrier(0); });
  store->wait({JobKeys(0).done(first[0].node_rank)}, 8s);  // a finished
  const auto failed = b.agent->publish_failure(0, {first[1].node_rank, 3, 3, "b", "exited with code 3",
                                                   NoticeKind::kWorker});
  CHECK(failed.kind == NoticeKind::kStop);
  REQUIRE(barrier.wait_for(8s) == std::future_status::ready);
  auto seen = barrier.get();
  REQUIRE(seen);
  CHECK(seen->kind == NoticeKind::kStop);
}

// The job ended with its last attempt (no restart left): newcomers arriving then must
// hear that, not form a new attempt among themselves.
TEST_CASE("elastic: newcomers cannot re-form a job whose last attempt ended it", "[elastic_rdzv]") {
  testing::ServerThread server;
  auto store = server.client();
  NodeSpec s;
  s.max_restarts = 0;
  auto a = std::make_unique<Node>(server, "a", s);
  auto b = std::make_unique<Node>(server, "b", s);
  join_all({a.get(), b.get()}, 0);
  a.reset();  // both killed: the attempt fails with no restart left
  b.reset();
  REQUIRE(failure_of(*store, 0).kind == NoticeKind::kNodeLost);
  Node c(server, "c", s), d(server, "d", s);
  auto joining_c = c.join(0);
  auto joining_d = d.join(0);
  for (auto* joining : {&joining_c, &joining_d}) {
    REQUIRE(joining->wait_for(8s) == std::future_status::ready);
    const auto over = job_over(*joining);
    CHECK(over.status == ddprun::kExitNodeLost);  // the lost nodes' status ended it
    CHECK(over.message.find("no restart left") != std::string::npos);
  }
  CHECK_FALSE(store->check({JobKeys(1).members()}));
}

// A node leaving from a join it never completed has no group rank in that attempt: it
// must not write left/<its old rank> there (another member's key).
TEST_CASE("elastic: leaving from an unfinished join writes no left key under a stale rank", "[elastic_rdzv]") {
  TwoRunning job;
  auto& [server, store, a, b, first] = job;
  REQUIRE(first[1].node_rank == 1);
  b.stop = 15;
  CHECK_THROWS_AS(b.agent->join(1), ddprun::Interrupted);
  b.agent->leave(1, 0s);
  CHECK_FALSE(store->check({JobKeys(1).left(1)}));
  const auto members = ddprun::elastic::MemberList::decode(store->get(JobKeys(0).members(), 1s));
  CHECK(store->check({JobKeys::elastic_lost(members.ids[1])}));
}

// The store's host gave up below MIN: it lingers until the nodes that waited beside it
// read the end and left, not for the whole linger.
TEST_CASE("elastic: a node leaving after giving up lingers only until the waiters left", "[elastic_rdzv]") {
  testing::ServerThread server;
  Node quick(server, "quick", {3, 4, -1, 0.3, 1.5});
  Node patient(server, "patient", {3, 4, -1, 0.3, 60});
  auto waiting = patient.join(0);
  CHECK_THROWS_AS(quick.agent->join(0), ddprun::LaunchError);
  const auto start = Clock::now();
  auto lingering = std::async(std::launch::async, [&] { quick.agent->leave(0, 6s); });
  job_over(waiting);
  patient.agent->leave(0, 0s);
  REQUIRE(lingering.wait_for(8s) == std::future_status::ready);
  CHECK(seconds_since(start) < 4);
}
