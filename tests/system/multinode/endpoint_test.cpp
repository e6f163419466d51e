// torchrun's c10d endpoint on real hosts (network namespaces): PyTorch's multi-node
// recipe launched unchanged, `--rdzv_endpoint HOST[:PORT]` with no daemon, where the
// node HOST names hosts the store (by address, or by host name with per-node host
// names and hosts files, including a name that resolves only seconds after the nodes
// started), node ranks by arrival, an elastic job a node joins later, is_host
// overriding the match, a ddp-rendezvous daemon at the endpoint, and two jobs under
// one --rdzv_id refused.
#include <catch2/catch.hpp>
#include <signal.h>

#include <set>
#include <thread>

#include "e2e.hpp"
#include "netns.hpp"
#include "netns_names.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kRendezvousBin = RENDEZVOUS_BIN;

// PyTorch's documented recipe, with bounds a test needs and -v (who hosts, and why).
std::vector<std::string> recipe(const std::string& endpoint, std::vector<std::string> extra,
                                std::vector<std::string> program) {
  std::vector<std::string> a = {e2e::kDdprun,        "--nnodes=2",        "--nproc_per_node=2",
                                "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint, "--join_timeout=30",
                                "--heartbeat_timeout=3", "--grace_period=3", "-v"};
  a.insert(a.end(), extra.begin(), extra.end());
  a.insert(a.end(), program.begin(), program.end());
  return a;
}

const std::vector<std::string> kProbe = {e2e::kWorker, "env", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK",
                                         "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID"};

std::string value_of(const std::vector<std::string>& lines, const std::string& key) {
  for (const auto& l : lines) {
    if (l.rfind(key + "=", 0) == 0) return l.substr(key.size() + 1);
  }
  return "?";
}

// Both nodes of a 2 × 2 recipe ended 0, and between them ranks 0..3 ran once each, in
// world 4, each node's ranks following its group rank (two different ones).
void check_formed(std::vector<std::unique_ptr<Process>>& nodes, const std::string& run_id) {
  std::set<int> ranks;
  std::set<std::string> group_ranks;
  for (auto& n : nodes) {
    auto status = n->wait(60s);
    INFO("stderr: " << n->err() << "\nstdout: " << n->out());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    for (const auto& [rank, lines] : e2e::by_rank(n->out())) {
      CHECK(ranks.insert(rank).second);
      CHECK(value_of(lines, "WORLD_SIZE") == "4");
      CHECK(value_of(lines, "GROUP_WORLD_SIZE") == "2");
      CHECK(value_of(lines, "TORCHELASTIC_RUN_ID") == run_id);
      const std::string group = value_of(lines, "GROUP_RANK");
      CHECK(std::to_string(rank) == std::to_string(std::stoi(group) * 2 + std::stoi(value_of(lines, "LOCAL_RANK"))));
      group_ranks.insert(group);
    }
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(group_ranks == std::set<std::string>{"0", "1"});
}

}  // namespace

TEST_CASE("c10d recipe: the node whose address the endpoint names hosts the store and ranks follow arrival",
          "[multinode][endpoint]") {
  NetnsCluster c(2);
  const std::string endpoint = c.address(0) + ":29400";
  std::vector<std::unique_ptr<Process>> nodes;
  // The client first: it retries until the host's store is up.
  nodes.push_back(std::make_unique<Process>(c.on(1, recipe(endpoint, {"--rdzv_id=100"}, kProbe))));
  std::this_thread::sleep_for(500ms);
  nodes.push_back(std::make_unique<Process>(c.on(0, recipe(endpoint, {"--rdzv_id=100"}, kProbe))));
  check_formed(nodes, "100");
  CHECK_THAT(nodes[1]->err(), Catch::Contains("rendezvous: this node hosts the store at " + endpoint + " (" +
                                              c.address(0) + " is an address of this host)"));
  CHECK_THAT(nodes[0]->err(), Catch::Contains("rendezvous: a client of the store at " + endpoint));
  CHECK_THAT(nodes[0]->err(), Catch::Contains("node rank by arrival"));
}

TEST_CASE("c10d recipe by host name: the port defaults to 29400 and a name that resolves late is waited for",
          "[multinode][endpoint]") {
  NetnsCluster c(2);
  NetnsHostsFiles hosts(c);
  const HostsEntry node0{c.address(0), {"node0"}}, node1{c.address(1), {"node1"}};
  hosts.write(0, {node0, node1});
  hosts.write(1, {node1});  // node0 is not known on node 1 yet (a headless Service's name comes later)
  const std::vector<std::string> notices = {"env", "DDP_WAIT_NOTICE_SEC=1"};
  auto on = [&](int i) {
    std::vector<std::string> a = notices;
    for (const auto& w : recipe("node0", {}, kProbe)) a.push_back(w);
    return on_named(c, i, "node" + std::to_string(i), a);
  };
  std::vector<std::unique_ptr<Process>> nodes;
  nodes.push_back(std::make_unique<Process>(on(1)));
  nodes.push_back(std::make_unique<Process>(on(0)));
  // Node 1 says it is waiting for a name that does not resolve, and goes on once it does.
  std::this_thread::sleep_for(3s);
  CHECK_THAT(nodes[0]->err(), Catch::Contains("still waiting for the store at node0:29400") &&
                                  Catch::Contains("cannot resolve 'node0'"));
  CHECK(e2e::by_rank(nodes[0]->out()).empty());
  hosts.write(1, {node0, node1});
  check_formed(nodes, "none");  // torchrun's default id
  CHECK_THAT(nodes[1]->err(), Catch::Contains("rendezvous: this node hosts the store at node0:29400 (host name "
                                              "node0 matches)"));
  CHECK_THAT(nodes[0]->err(), Catch::Contains("rendezvous: a client of the store at node0:29400 (node0 "));
}

TEST_CASE("c10d endpoint elastic 1:3: the host runs alone and a node joining later re-forms the job",
          "[multinode][endpoint]") {
  NetnsCluster c(2);
  const std::string endpoint = c.address(0);  // port 29400
  // Each attempt says its world; the attempt of two nodes finishes.
  const std::vector<std::string> program = {
      "/bin/sh", "-c",
      "echo \"world=$WORLD_SIZE rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT\"; "
      "[ \"$WORLD_SIZE\" = 2 ] && exit 0; exec sleep 60"};
  auto node = [&](int i) {
    return c.on(i, recipe(endpoint, {"--nnodes=1:3", "--nproc_per_node=1", "--rdzv_conf=last_call_timeout=1"},
                          program));
  };
  Process first(node(0));
  REQUIRE(first.wait_for_stdout([](const std::string& out) { return out.find("world=1 rank=0") != std::string::npos; },
                                30s));
  Process second(node(1));
  for (Process* p : {&first, &second}) {
    auto status = p->wait(60s);
    INFO("stderr: " << p->err() << "\nstdout: " << p->out());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    CHECK_THAT(p->out(), Catch::Contains("world=2 rank=") && Catch::Contains("restart=0"));  // a join uses no restart
  }
  CHECK_THAT(first.err(), Catch::Contains("rendezvous: this node hosts the store at " + endpoint + ":29400"));
  CHECK_THAT(first.err(), Catch::Contains("re-forming the job with more nodes"));
}

TEST_CASE("c10d recipe: a lost node started again takes its place while restarts remain", "[multinode][endpoint]") {
  // Ranks by arrival are rounds of MIN = MAX = 2, as torchrun's dynamic rendezvous: a
  // node lost ends the attempt, the job waits for two nodes again, and the node's
  // replacement (a pod started again) is admitted. The attempt after the restart finishes.
  NetnsCluster c(2);
  const std::string endpoint = c.address(0) + ":29400";
  const std::vector<std::string> program = {
      "/bin/sh", "-c",
      "echo \"world=$WORLD_SIZE rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT\"; "
      "[ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ] && exit 0; exec sleep 60"};
  auto node = [&](int i) { return c.on(i, recipe(endpoint, {"--max_restarts=1"}, program)); };
  auto started = [](int n) {
    return [n](const std::string& out) {
      size_t count = 0;
      for (size_t p = out.find("world=4 "); p != std::string::npos; p = out.find("world=4 ", p + 1)) ++count;
      return count >= static_cast<size_t>(n);
    };
  };
  Process host(node(0));
  auto lost = std::make_unique<Process>(node(1));
  REQUIRE(host.wait_for_stdout(started(2), 30s));
  REQUIRE(lost->wait_for_stdout(started(2), 30s));
  lost->send_signal(SIGKILL);
  REQUIRE(lost->wait(10s).has_value());
  Process again(node(1));
  for (Process* p : {&host, &again}) {
    auto status = p->wait(60s);
    INFO("stderr: " << p->err() << "\nstdout: " << p->out());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    CHECK_THAT(p->out(), Catch::Contains("world=4 ") && Catch::Contains("restart=1"));
  }
  CHECK_THAT(host.err(), Catch::Contains("re-forming the job without the lost node (restart 1 of 1)"));
}

TEST_CASE("c10d endpoint: is_host in --rdzv_conf overrides the name match", "[multinode][endpoint]") {
  // Node 0 is called "rdzv", the endpoint's name, but the name leads to node 1: node 0
  // told is_host=false stays a client; node 1 hosts (is_host=true).
  NetnsCluster c(2);
  NetnsHostsFiles hosts(c);
  hosts.write_all({{c.address(1), {"rdzv", "node1"}}, {c.address(0), {"node0"}}}, 2);
  std::vector<std::unique_ptr<Process>> nodes;
  nodes.push_back(std::make_unique<Process>(
      on_named(c, 0, "rdzv", recipe("rdzv:29400", {"--rdzv_conf=is_host=false"}, kProbe))));
  nodes.push_back(std::make_unique<Process>(
      on_named(c, 1, "node1", recipe("rdzv:29400", {"--rdzv_conf=is_host=true"}, kProbe))));
  check_formed(nodes, "none");
  CHECK_THAT(nodes[0]->err(), Catch::Contains("rendezvous: a client of the store at rdzv:29400 (is_host=false in "
                                              "--rdzv_conf)"));
  CHECK_THAT(nodes[1]->err(), Catch::Contains("rendezvous: this node hosts the store at rdzv:29400 (is_host=true in "
                                              "--rdzv_conf)"));
}

TEST_CASE("c10d endpoint: a ddp-rendezvous daemon there still serves and two jobs under one id are refused",
          "[multinode][endpoint]") {
  NetnsCluster c(2);
  const std::string endpoint = c.address(0) + ":29400";
  Process daemon(c.on(0, {kRendezvousBin, "--port=29400", "--heartbeat-timeout=3"}));
  REQUIRE(daemon.wait_for_stdout([](const std::string& s) { return s.find("listening") != std::string::npos; }, 10s));
  const std::vector<std::string> waits = {e2e::kWorker, "trap", "SIGTERM"};

  // Job A: ranks by arrival, id none; node 0 matches the endpoint but the daemon has the port.
  std::vector<std::unique_ptr<Process>> job_a;
  for (int i = 0; i < 2; ++i) job_a.push_back(std::make_unique<Process>(c.on(i, recipe(endpoint, {}, waits))));
  for (auto& n : job_a) {
    INFO("stderr: " << n->err());
    REQUIRE(n->wait_for_stdout([](const std::string& out) { return e2e::by_rank(out).size() == 2; }, 30s));
  }
  CHECK_THAT(job_a[0]->err(), Catch::Contains("but port 29400 is taken"));
  // Job B: the same command again, a third node of a full job whose nodes all live.
  Process job_b(c.on(1, recipe(endpoint, {}, waits)));
  auto b = job_b.wait(40s);
  INFO("job B stderr: " << job_b.err());
  REQUIRE(b.has_value());
  CHECK(*b == 2);
  CHECK_THAT(job_b.err(), Catch::Contains("rendezvous: another job uses --rdzv_id none at " + endpoint +
                                          "; give each job its own --rdzv_id"));
  CHECK(e2e::by_rank(job_b.out()).empty());

  // Fixed node ranks under one id: a second launch claiming node rank 0 is refused at once.
  std::vector<std::unique_ptr<Process>> job_f;
  for (int i = 0; i < 2; ++i) {
    job_f.push_back(std::make_unique<Process>(
        c.on(i, recipe(endpoint, {"--rdzv_id=fixed", "--node_rank=" + std::to_string(i)}, waits))));
  }
  for (auto& n : job_f) {
    INFO("stderr: " << n->err());
    REQUIRE(n->wait_for_stdout([](const std::string& out) { return e2e::by_rank(out).size() == 2; }, 30s));
  }
  Process job_g(c.on(1, recipe(endpoint, {"--rdzv_id=fixed", "--node_rank=0"}, waits)));
  auto g = job_g.wait(20s);
  INFO("job G stderr: " << job_g.err());
  REQUIRE(g.has_value());
  CHECK(*g == 2);
  CHECK_THAT(job_g.err(), Catch::Contains("rendezvous: another job uses --rdzv_id fixed at " + endpoint));

  // is_host=true where the port is taken: one clear error.
  Process forced(c.on(0, recipe(endpoint, {"--rdzv_id=forced", "--rdzv_conf=is_host=true"}, waits)));
  auto f = forced.wait(20s);
  REQUIRE(f.has_value());
  CHECK(*f == 1);
  CHECK_THAT(forced.err(), Catch::Contains("is_host=true in --rdzv_conf, but this node cannot host the store on port "
                                           "29400"));

  // The running jobs were not disturbed: every worker still runs, and each job ends cleanly.
  for (auto* job : {&job_a, &job_f}) {
    for (auto& n : *job) {
      INFO("node stderr: " << n->err());
      CHECK_FALSE(n->wait(1ms).has_value());
    }
  }
  for (auto* job : {&job_a, &job_f}) {
    for (auto& n : *job) n->send_signal(SIGTERM);
    for (auto& n : *job) CHECK(n->wait(20s).has_value());
  }
}
