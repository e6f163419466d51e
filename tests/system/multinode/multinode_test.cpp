// Multi-node launches on real hosts: one ddprun per network namespace, talking
// over veth links, as on separate machines.
#include <catch2/catch.hpp>
#include <signal.h>

#include <ctime>
#include <regex>
#include <set>
#include <thread>

#include "e2e.hpp"
#include "netns.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kRendezvousBin = RENDEZVOUS_BIN;

// The flags every node of a cluster job gets.
std::vector<std::string> node_args(const NetnsCluster& c, int nnodes, int rank, int nproc,
                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {e2e::kDdprun,
                                "--nnodes=" + std::to_string(nnodes),
                                "--node_rank=" + std::to_string(rank),
                                "--master_addr=" + c.address(0),
                                "--master_port=29500",
                                "--nproc_per_node=" + std::to_string(nproc),
                                "--join_timeout=30",
                                "--heartbeat_timeout=3",
                                "--grace_period=5"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// "...at 2026-11-22T02:59:23.856Z" -> seconds since the epoch, for every such stamp after `marker`.
std::vector<double> stamps_after(const std::string& text, const std::string& marker) {
  std::vector<double> out;
  auto from = text.find(marker);
  if (from == std::string::npos) return out;
  std::regex stamp(R"(at (\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z)");
  std::string rest = text.substr(from);
  for (std::sregex_iterator it(rest.begin(), rest.end(), stamp), end; it != end; ++it) {
    std::tm tm{};
    tm.tm_year = std::stoi((*it)[1]) - 1900;
    tm.tm_mon = std::stoi((*it)[2]) - 1;
    tm.tm_mday = std::stoi((*it)[3]);
    tm.tm_hour = std::stoi((*it)[4]);
    tm.tm_min = std::stoi((*it)[5]);
    tm.tm_sec = std::stoi((*it)[6]);
    out.push_back(static_cast<double>(timegm(&tm)) + std::stoi((*it)[7]) / 1000.0);
  }
  return out;
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Seconds from `event` (wall clock) until this node's workers were stopped, from its summary.
double stopped_after(const std::string& err, double event) {
  auto stamps = stamps_after(err, "This node's workers");
  return stamps.empty() ? 1e9 : *std::max_element(stamps.begin(), stamps.end()) - event;
}

bool wait_ready(const Process& p, int ranks_from, int ranks_to) {
  return p.wait_for_stdout(
      [&](const std::string& out) {
        auto r = e2e::by_rank(out);
        for (int i = ranks_from; i < ranks_to; ++i) {
          if (std::find(r[i].begin(), r[i].end(), "ready") == r[i].end()) return false;
        }
        return true;
      },
      30s);
}

}  // namespace

TEST_CASE("ranks follow node order with unequal workers per node", "[multinode]") {
  NetnsCluster c(3);
  const std::vector<std::string> probe = {e2e::kWorker, "env", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                          "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
                                          "MASTER_PORT", "TORCHELASTIC_RUN_ID", "DDPRUN_STORE_ADDR"};
  const int nproc[3] = {1, 2, 3};
  std::vector<std::unique_ptr<Process>> nodes;
  for (int i = 2; i >= 0; --i) {  // start in reverse: node 0 is last, the others wait for it
    nodes.push_back(std::make_unique<Process>(c.on(i, with(node_args(c, 3, i, nproc[i]), probe))));
  }
  std::reverse(nodes.begin(), nodes.end());
  std::map<int, std::vector<std::string>> all;  // global rank -> its lines
  std::set<std::string> run_ids, master_ports;
  int first_rank[3] = {0, 1, 3};
  for (int i = 0; i < 3; ++i) {
    auto status = nodes[i]->wait(60s);
    INFO("node " << i << " stderr: " << nodes[i]->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    for (auto& [rank, lines] : e2e::by_rank(nodes[i]->out())) {
      all[rank] = lines;
      auto has = [&](const std::string& kv) { return std::find(lines.begin(), lines.end(), kv) != lines.end(); };
      CHECK(has("RANK=" + std::to_string(rank)));
      CHECK(has("LOCAL_RANK=" + std::to_string(rank - first_rank[i])));
      CHECK(has("WORLD_SIZE=6"));
      CHECK(has("LOCAL_WORLD_SIZE=" + std::to_string(nproc[i])));
      CHECK(has("GROUP_RANK=" + std::to_string(i)));
      CHECK(has("GROUP_WORLD_SIZE=3"));
      CHECK(has("MASTER_ADDR=" + c.address(0)));
      CHECK(has("DDPRUN_STORE_ADDR=" + c.address(0)));
      for (const auto& l : lines) {
        if (l.rfind("TORCHELASTIC_RUN_ID=", 0) == 0) run_ids.insert(l);
        if (l.rfind("MASTER_PORT=", 0) == 0) master_ports.insert(l);
      }
    }
  }
  CHECK(all.size() == 6);
  CHECK(run_ids.size() == 1);       // every node took node 0's run id
  // MASTER_PORT: node 0's store (--master_port), which serves the torch workers (agent store).
  CHECK(master_ports == std::set<std::string>{"MASTER_PORT=29500"});
}

TEST_CASE("a worker failure on node 1 tears down node 0 within 1 s", "[multinode]") {
  NetnsCluster c(2);
  // Global rank 1 (node 1's only worker) fails; rank 0 on node 0 would sleep for 10 minutes.
  Process n1(c.on(1, with(node_args(c, 2, 1, 1), {e2e::kWorker, "fail", "1", "3"})));
  Process n0(c.on(0, with(node_args(c, 2, 0, 1), {e2e::kWorker, "fail", "1", "3"})));
  auto s0 = n0.wait(60s);
  auto s1 = n1.wait(60s);
  INFO("node 0:\n" << n0.err() << "\nnode 1:\n" << n1.err());
  REQUIRE(s0.has_value());
  REQUIRE(s1.has_value());
  CHECK(*s0 == 3);  // every node exits with the root cause's status
  CHECK(*s1 == 3);
  CHECK_THAT(n0.err(), Catch::Contains("rank 1 on node 1") && Catch::Contains("exited with code 3"));
  auto failed_at = stamps_after(n1.err(), "Root cause");
  auto stopped_at = stamps_after(n0.err(), "This node's workers");
  REQUIRE(!failed_at.empty());
  REQUIRE(stopped_at.size() == 1);
  CHECK(stopped_at[0] - failed_at[0] <= 1.0);
}

TEST_CASE("a missing node gives a join timeout naming it", "[multinode]") {
  NetnsCluster c(2);
  auto args = [&](int i) { return with(node_args(c, 3, i, 1, {"--join_timeout=2"}), {e2e::kWorker, "env", "RANK"}); };
  Process n1(c.on(1, args(1)));
  Process n0(c.on(0, args(0)));
  for (Process* p : {&n0, &n1}) {
    auto status = p->wait(30s);
    REQUIRE(status.has_value());
    CHECK(*status == 1);
    CHECK_THAT(p->err(), Catch::Contains("node rank(s) 2 of 3"));
    CHECK(e2e::by_rank(p->out()).empty());  // no worker started
  }
}

TEST_CASE("a node whose ddprun is killed fails the job on the others", "[multinode]") {
  NetnsCluster c(2);
  Process n1(c.on(1, with(node_args(c, 2, 1, 1), {e2e::kWorker, "ignore-term"})));
  Process n0(c.on(0, with(node_args(c, 2, 0, 1), {e2e::kWorker, "trap", std::to_string(SIGTERM)})));
  REQUIRE(wait_ready(n0, 0, 1));
  REQUIRE(wait_ready(n1, 1, 2));
  double killed = wall_now();
  n1.send_signal(SIGKILL);
  auto status = n0.wait(30s);
  INFO(n0.err());
  REQUIRE(status.has_value());
  CHECK(stopped_after(n0.err(), killed) <= 3.0);  // within the heartbeat timeout
  CHECK(*status == 75);  // a node was lost (ddprun's kExitNodeLost)
  CHECK_THAT(n0.err(), Catch::Contains("node 1") && Catch::Contains("ddprun was lost"));
  CHECK(std::find(e2e::by_rank(n0.out())[0].begin(), e2e::by_rank(n0.out())[0].end(), "got SIGTERM") !=
        e2e::by_rank(n0.out())[0].end());
}

TEST_CASE("a node cut off from the network fails the job on both sides", "[multinode]") {
  NetnsCluster c(2);
  Process n1(c.on(1, with(node_args(c, 2, 1, 1), {e2e::kWorker, "trap", std::to_string(SIGTERM)})));
  Process n0(c.on(0, with(node_args(c, 2, 0, 1), {e2e::kWorker, "trap", std::to_string(SIGTERM)})));
  REQUIRE(wait_ready(n0, 0, 1));
  REQUIRE(wait_ready(n1, 1, 2));
  double cut_at = wall_now();
  c.cut(1);
  auto s0 = n0.wait(30s);
  auto s1 = n1.wait(30s);
  INFO("node 0:\n" << n0.err() << "\nnode 1:\n" << n1.err());
  REQUIRE(s0.has_value());
  REQUIRE(s1.has_value());
  CHECK(stopped_after(n0.err(), cut_at) <= 3.0);  // within the heartbeat timeout
  // Not on a healthy link: a cut link is seen by the store's TCP keepalive (3 s timeout:
  // 1 s idle, then one probe 1 s later, socket_options.cpp), counted from node 1's last
  // packet, a ping at most 0.75 s (a quarter of the timeout) before the cut. So 1.25 s
  // is the earliest a correct detection can come; the silence limit (2.7 s after the
  // last ping) comes later. Measured: 1.89 to 1.94 s.
  CHECK(stopped_after(n0.err(), cut_at) >= 1.25);
  CHECK(*s0 == 75);  // a node was lost (ddprun's kExitNodeLost)
  CHECK(*s1 == 75);  // a node was lost (ddprun's kExitNodeLost)
  CHECK_THAT(n0.err(), Catch::Contains("node 1") && Catch::Contains("ddprun was lost"));
  CHECK_THAT(n1.err(), Catch::Contains("rendezvous store") && Catch::Contains("is gone"));
}

TEST_CASE("when node 0 is lost the others say the store host is gone", "[multinode]") {
  NetnsCluster c(2);
  Process n1(c.on(1, with(node_args(c, 2, 1, 1), {e2e::kWorker, "trap", std::to_string(SIGTERM)})));
  Process n0(c.on(0, with(node_args(c, 2, 0, 1), {e2e::kWorker, "ignore-term"})));
  REQUIRE(wait_ready(n1, 1, 2));
  REQUIRE(wait_ready(n0, 0, 1));
  n0.send_signal(SIGKILL);
  auto status = n1.wait(30s);
  INFO(n1.err());
  REQUIRE(status.has_value());
  CHECK(*status == 75);  // a node was lost (ddprun's kExitNodeLost)
  CHECK_THAT(n1.err(), Catch::Contains("rendezvous store at " + c.address(0)) && Catch::Contains("is gone"));
}

TEST_CASE("a ddp-rendezvous daemon serves two jobs at once, apart", "[multinode]") {
  NetnsCluster c(3);
  TempDir dir;
  write_file(dir / "token", "job-secret\n");
  write_file(dir / "secret", "daemon-secret\n");
  Process daemon(c.on(2, {kRendezvousBin, "--port=29400", "--token-file", (dir / "token").string(), "--secret-file",
                          (dir / "secret").string()}));
  REQUIRE(daemon.wait_for_stdout([](const std::string& o) { return o.find("listening") != std::string::npos; }, 10s));
  // alpha uses the shared token, beta only its own credential as the daemon prints it.
  auto credential = run({kRendezvousBin, "credential", "--job=beta", "--secret-file", (dir / "secret").string()});
  REQUIRE(credential.status == 0);
  write_file(dir / "beta.cred", credential.out);
  const std::string endpoint = "--rdzv_endpoint=" + c.address(2) + ":29400";
  auto token_file = [&](const std::string& job) {
    return "--rdzv_token_file=" + (dir / (job == "alpha" ? "token" : "beta.cred")).string();
  };
  std::vector<std::unique_ptr<Process>> procs;
  for (const std::string job : {"alpha", "beta"}) {
    for (int node = 0; node < 2; ++node) {
      std::vector<std::string> a = {e2e::kDdprun, "--nnodes=2", "--node_rank=" + std::to_string(node),
                                    "--nproc_per_node=" + std::string(job == "alpha" ? "1" : "2"), endpoint,
                                    "--rdzv_id=" + job, token_file(job), "--join_timeout=30",
                                    e2e::kWorker, "env", "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR"};
      procs.push_back(std::make_unique<Process>(c.on(node, a)));
    }
  }
  for (size_t i = 0; i < procs.size(); ++i) {
    auto status = procs[i]->wait(60s);
    INFO("process " << i << ": " << procs[i]->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    bool alpha = i < 2;
    for (auto& [rank, lines] : e2e::by_rank(procs[i]->out())) {
      CHECK(std::find(lines.begin(), lines.end(), std::string("WORLD_SIZE=") + (alpha ? "2" : "4")) != lines.end());
      CHECK(std::find(lines.begin(), lines.end(), std::string("TORCHELASTIC_RUN_ID=") + (alpha ? "alpha" : "beta")) !=
            lines.end());
      CHECK(std::find(lines.begin(), lines.end(), "MASTER_ADDR=" + c.address(0)) != lines.end());
    }
  }
  // A node without the token gets nothing from the daemon.
  auto refused = run(c.on(1, {e2e::kDdprun, "--nnodes=2", "--node_rank=1", endpoint, "--rdzv_id=alpha",
                              "--join_timeout=5", e2e::kWorker, "env", "RANK"}));
  CHECK(refused.status == 1);
  CHECK_THAT(refused.err, Catch::Contains("requires a token"));
  // Nor does one with beta's credential naming alpha.
  auto crossed = run(c.on(1, {e2e::kDdprun, "--nnodes=2", "--node_rank=1", endpoint, "--rdzv_id=alpha",
                              token_file("beta"), "--join_timeout=5", e2e::kWorker, "env", "RANK"}));
  CHECK(crossed.status == 1);
  CHECK_THAT(crossed.err, Catch::Contains("authentication failed"));
  daemon.send_signal(SIGTERM);
  auto d = daemon.wait(10s);
  REQUIRE(d.has_value());
  CHECK(*d == 0);
}

TEST_CASE("a frozen ddprun fails the job within the heartbeat timeout", "[multinode]") {
  NetnsCluster c(2);
  Process n1(c.on(1, with(node_args(c, 2, 1, 1), {e2e::kWorker, "ignore-term"})));
  Process n0(c.on(0, with(node_args(c, 2, 0, 1), {e2e::kWorker, "trap", std::to_string(SIGTERM)})));
  REQUIRE(wait_ready(n0, 0, 1));
  REQUIRE(wait_ready(n1, 1, 2));
  double frozen_at = wall_now();
  n1.send_signal(SIGSTOP);  // alive to TCP, silent to the store
  auto status = n0.wait(30s);
  n1.send_signal(SIGKILL);
  INFO(n0.err());
  REQUIRE(status.has_value());
  // Within the heartbeat timeout, but not before three pings in a row were missed.
  CHECK(stopped_after(n0.err(), frozen_at) <= 3.0);
  CHECK(stopped_after(n0.err(), frozen_at) >= 1.9);
  CHECK(*status == 75);  // a node was lost (ddprun's kExitNodeLost)
  CHECK_THAT(n0.err(), Catch::Contains("ddprun was lost"));
}

TEST_CASE("a node lost after its workers all succeeded does not fail the others", "[multinode]") {
  NetnsCluster c(2);
  // Node 1's worker exits 0 at once; its ddprun is then frozen in its exit barrier.
  // Node 0's worker runs past the heartbeat timeout: node 1's silence must not end it.
  Process n1(c.on(1, with(node_args(c, 2, 1, 1), {"sh", "-c", "echo bye; exit 0"})));
  Process n0(c.on(0, with(node_args(c, 2, 0, 1), {"sh", "-c", "sleep 6; echo finished; exit 0"})));
  REQUIRE(n1.wait_for_stdout([](const std::string& out) { return out.find("bye") != std::string::npos; }, 20s));
  std::this_thread::sleep_for(500ms);  // reaped, exit published, done key set
  n1.send_signal(SIGSTOP);
  auto status = n0.wait(30s);
  CHECK_FALSE(n1.wait(0s).has_value());  // it really was frozen, not finished
  n1.send_signal(SIGKILL);
  INFO(n0.err());
  REQUIRE(status.has_value());
  CHECK(*status == 0);
  CHECK_THAT(n0.out(), Catch::Contains("finished"));
  CHECK_THAT(n0.err(), !Catch::Contains("was lost"));
}

TEST_CASE("a signal during the join ends ddprun at once and tells the others", "[multinode]") {
  NetnsCluster c(3);
  // Node 2 never comes, so nodes 0 and 1 wait in the join.
  Process n1(c.on(1, with(node_args(c, 3, 1, 1), {e2e::kWorker, "env", "RANK"})));
  Process n0(c.on(0, with(node_args(c, 3, 0, 1), {e2e::kWorker, "env", "RANK"})));
  std::this_thread::sleep_for(1500ms);
  n1.send_signal(SIGINT);
  auto s1 = n1.wait(10s);
  REQUIRE(s1.has_value());
  CHECK(*s1 == 130);
  CHECK_THAT(n1.err(), Catch::Contains("received SIGINT while joining"));
  n0.send_signal(SIGTERM);
  auto s0 = n0.wait(10s);
  REQUIRE(s0.has_value());
  CHECK(*s0 == 143);
  CHECK(e2e::by_rank(n0.out()).empty());
}

TEST_CASE("with restarts, a lost node ends the job instead of a second rendezvous", "[multinode]") {
  NetnsCluster c(2);
  Process n1(c.on(1, with(node_args(c, 2, 1, 1, {"--max_restarts=2"}), {e2e::kWorker, "ignore-term"})));
  Process n0(c.on(0, with(node_args(c, 2, 0, 1, {"--max_restarts=2"}), {e2e::kWorker, "trap", std::to_string(SIGTERM)})));
  REQUIRE(wait_ready(n0, 0, 1));
  REQUIRE(wait_ready(n1, 1, 2));
  n1.send_signal(SIGKILL);
  auto status = n0.wait(20s);
  INFO(n0.err());
  REQUIRE(status.has_value());
  CHECK(*status == 75);  // a node was lost (ddprun's kExitNodeLost)
  CHECK(n0.err().find("restarting") == std::string::npos);
}

TEST_CASE("workers on every node reach node 0's store through DDPRUN_STORE_*", "[multinode]") {
  NetnsCluster c(2);
  Process n1(c.on(1, with(node_args(c, 2, 1, 2), {e2e::kWorker, "store"})),
             {{{"DDPRUN_TOKEN", "shared-secret"}}, {}});
  Process n0(c.on(0, with(node_args(c, 2, 0, 2), {e2e::kWorker, "store"})),
             {{{"DDPRUN_TOKEN", "shared-secret"}}, {}});
  std::set<std::string> arrivals;
  for (Process* p : {&n0, &n1}) {
    auto status = p->wait(60s);
    INFO(p->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    for (auto& [rank, lines] : e2e::by_rank(p->out())) {
      REQUIRE(lines.size() == 1);
      CHECK_THAT(lines[0], Catch::StartsWith("got 'from rank 0', arrival "));
      arrivals.insert(lines[0].substr(lines[0].rfind(' ') + 1));
    }
  }
  CHECK(arrivals == std::set<std::string>{"1", "2", "3", "4"});
}
