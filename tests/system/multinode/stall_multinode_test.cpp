// Stall reports across two hosts (network namespaces, one ddprun each): every node
// detects the same stall, node 1 sends its workers' part, node 0 prints the one
// report; with --stall_action=stop every node ends with it as root cause. A send/recv
// deadlock whose recvs cross the hosts is named as one.
#include <catch2/catch.hpp>
#include <signal.h>

#include <thread>

#include "e2e.hpp"
#include "netns.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// Two nodes with two workers each; rank 3 (node 1) sleeps in its compute loop after
// all_reduce #4 while ranks 0-2 wait in #5.
std::vector<std::string> stall_node(const NetnsCluster& c, int node, const std::string& action) {
  return c.on(node, {e2e::kDdprun, "--nnodes=2", "--node_rank=" + std::to_string(node), "--master_addr=" + c.address(0),
                     "--master_port=29500", "--nproc_per_node=2", "--join_timeout=30", "--heartbeat_timeout=3",
                     "--grace_period=3", "--stall_timeout=2", "--stall_action=" + action, e2e::kWorker, "progress",
                     "stall", "3", "4"});
}

ProcessOptions with_token() { return {{{"DDPRUN_TOKEN", "stall-secret"}}, {}}; }

void check_report(const std::string& report) {
  CHECK(contains(report, "rank 3 never arrived at all_reduce #5 of group 0, which ranks 0,1,2 wait in"));
  CHECK(contains(report, "rank 2 waits in all_reduce #5 of group 0"));
  CHECK(contains(report, "rank 3 never arrived; last completed all_reduce #4 of group 0"));
  // Both nodes' processes, node 1's gathered through the store.
  for (int r = 0; r < 4; ++r) CHECK(contains(report, "  rank " + std::to_string(r) + " on "));
  CHECK(!contains(report, "sent no process report"));
}

// Both nodes end with status 124 (--stall_action=stop); node 0's root cause section.
std::string stopped_root_cause(Process& n0, Process& n1) {
  auto s0 = n0.wait(60s);
  auto s1 = n1.wait(60s);
  INFO("node 0:\n" << n0.err() << "\nnode 1:\n" << n1.err());
  REQUIRE(s0.has_value());
  REQUIRE(s1.has_value());
  CHECK(*s0 == 124);
  CHECK(*s1 == 124);
  auto root = n0.err().find("Root cause (ddprun stopped a stalled job, --stall_action=stop):");
  REQUIRE(root != std::string::npos);
  return n0.err().substr(root);
}

}  // namespace

TEST_CASE("a stall across two hosts: node 0 prints one report with both nodes' workers", "[multinode][stall]") {
  NetnsCluster c(2);
  Process n1(stall_node(c, 1, "report"), with_token());
  Process n0(stall_node(c, 0, "report"), with_token());
  auto end = std::chrono::steady_clock::now() + 40s;
  while (std::chrono::steady_clock::now() < end && !contains(n0.err(), "The job goes on")) std::this_thread::sleep_for(50ms);
  INFO("node 0:\n" << n0.err() << "\nnode 1:\n" << n1.err());
  REQUIRE(contains(n0.err(), "The job goes on"));
  check_report(n0.err());
  CHECK(contains(n1.err(), "node 0 prints the report"));
  CHECK(!contains(n1.err(), "Calls:"));
  for (Process* p : {&n0, &n1}) p->send_signal(SIGTERM);
  CHECK(n0.wait(30s).has_value());
  CHECK(n1.wait(30s).has_value());
}

TEST_CASE("a stall across two hosts with stall action stop ends every node with it as root cause",
          "[multinode][stall]") {
  NetnsCluster c(2);
  Process n1(stall_node(c, 1, "stop"), with_token());
  Process n0(stall_node(c, 0, "stop"), with_token());
  check_report(stopped_root_cause(n0, n1));
  CHECK(contains(n1.err(), "stalled: rank 3 never arrived at all_reduce #5 of group 0"));
}

namespace {

const std::string kCycle = "rank 0 waits in recv #1 from rank 1, which waits in recv #1 from rank 0: a deadlock";

// Node `node` of a send/recv deadlock across two hosts: rank 0 on node 0, ranks 1..
// on node 1 (rank 0's recv crosses hosts); collective_worker's deadlock mode.
std::vector<std::string> deadlock_node(const NetnsCluster& c, int node, int ranks) {
  const int nproc = node == 0 ? 1 : ranks - 1;
  return c.on(node, {e2e::kDdprun, "--nnodes=2", "--node_rank=" + std::to_string(node), "--master_addr=" + c.address(0),
                     "--master_port=29500", "--nproc_per_node=" + std::to_string(nproc), "--join_timeout=30",
                     "--heartbeat_timeout=3", "--grace_period=3", "--stall_timeout=3", "--stall_action=stop",
                     COLLECTIVE_WORKER_BIN, "deadlock"});
}

void two_host_deadlock(int ranks) {
  NetnsCluster c(2);
  Process n1(deadlock_node(c, 1, ranks), with_token());
  Process n0(deadlock_node(c, 0, ranks), with_token());
  auto said = [&] {
    size_t n = 0;
    for (Process* p : {&n0, &n1}) {
      const std::string out = p->out();
      for (auto at = out.find("deadlocked at"); at != std::string::npos; at = out.find("deadlocked at", at + 1)) ++n;
    }
    return n;
  };
  auto end = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < end && said() < size_t(ranks)) std::this_thread::sleep_for(20ms);
  REQUIRE(said() == size_t(ranks));
  const double onset = n0.seconds_since_start();
  double named = -1;
  end = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < end && named < 0) {
    if (contains(n0.err(), kCycle + "; the report follows")) named = n0.seconds_since_start() - onset;
    std::this_thread::sleep_for(20ms);
  }
  std::printf("two hosts, %d ranks: deadlock named %.2f s after it formed (--stall_timeout=3)\n", ranks, named);
  CHECK(named >= 0);
  CHECK(named <= 3 + 10);  // --stall_timeout + 10 s: the target figure is scripts/bench/deadlock's
  const std::string report = stopped_root_cause(n0, n1);
  INFO("node 0:\n" << n0.err() << "\nnode 1:\n" << n1.err());
  CHECK(contains(report, "wait-for cycle: " + kCycle));
  CHECK(contains(report, "rank 0 waits in recv #1 from rank 1 (recv 4×f32 from 1, "));
  CHECK(contains(report, "rank 1 waits in recv #1 from rank 0 (recv 4×f32 from 0, "));
  for (int r = 0; r < ranks; ++r) CHECK(contains(report, "  rank " + std::to_string(r) + " on "));
  if (ranks == 3) {
    CHECK(contains(report, "rank 2 waits in barrier #2 of group 0 for ranks 0,1: rank 0 is blocked in recv #1 from "
                           "rank 1; rank 1 is blocked in recv #1 from rank 0"));
  }
  CHECK(contains(n1.err(), "stalled: " + kCycle));
}

}  // namespace

TEST_CASE("a send/recv deadlock of two ranks on two hosts is named and stopped", "[multinode][stall][deadlock]") {
  two_host_deadlock(2);
}

TEST_CASE("a send/recv deadlock on two hosts with a third rank in barrier is named and stopped",
          "[multinode][stall][deadlock]") {
  two_host_deadlock(3);
}
