// Choosing the network on hosts with two: network-namespace hosts with eth0 and eth1
// on separate bridges and subnets. DDP_SOCKET_IFNAME moves the CPU backend's TCP mesh
// to the interface it names (seen in the interfaces' own byte counters) and a name
// that matches none fails clearly; --local_addr is the address a node advertises,
// hence the workers' MASTER_ADDR when it is node 0.
#include <catch2/catch.hpp>
#include <signal.h>

#include <functional>
#include <map>
#include <memory>

#include "e2e.hpp"
#include "netns.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kCollectiveWorker = COLLECTIVE_WORKER_BIN;
const std::string kRendezvousBin = RENDEZVOUS_BIN;

constexpr long long kPayload = 8 << 20;  // bytes each rank all-reduces

struct JobResult {
  std::vector<int> status;  // per node
  std::vector<std::string> out, err;
};

// One ddprun per node (1 worker each, node 0 hosting the store on eth0), all with
// `env`, running `program`; waits for every node.
JobResult run_job(const NetnsCluster& c, int nodes, const std::map<std::string, std::string>& env,
                  const std::vector<std::string>& program) {
  ProcessOptions o;
  o.set_env = env;
  o.set_env["DDP_BACKEND"] = "cpu";
  std::vector<std::unique_ptr<Process>> ps;
  for (int i = 0; i < nodes; ++i) {
    std::vector<std::string> a = {e2e::kDdprun,         "--nnodes=" + std::to_string(nodes),
                                  "--node_rank=" + std::to_string(i), "--master_addr=" + c.address(0),
                                  "--master_port=29500", "--nproc_per_node=1",
                                  "--join_timeout=30",  "--heartbeat_timeout=3",
                                  "--grace_period=3"};
    a.insert(a.end(), program.begin(), program.end());
    ps.push_back(std::make_unique<Process>(c.on(i, a), o));
  }
  JobResult r;
  for (auto& p : ps) {
    auto status = p->wait(120s);
    INFO("stdout: " << p->out() << "\nstderr: " << p->err());
    REQUIRE(status.has_value());
    r.status.push_back(*status);
    r.out.push_back(p->out());
    r.err.push_back(p->err());
  }
  return r;
}

// Bytes that crossed `device` of node i (both ways) while `job` ran.
long long traffic(const NetnsCluster& c, int node, const std::string& device, const std::function<void()>& job) {
  const InterfaceBytes before = c.counters(node, device);
  job();
  const InterfaceBytes after = c.counters(node, device);
  return (after.tx - before.tx) + (after.rx - before.rx);
}

}  // namespace

TEST_CASE("DDP_SOCKET_IFNAME=eth1 moves the mesh's traffic to eth1", "[multinode][nic]") {
  NetnsCluster c(NetnsOptions{.nodes = 2, .second_interface = true});
  const std::vector<std::string> job = {kCollectiveWorker, "sum", std::to_string(kPayload)};
  // Each run: node 1's eth0 and eth1 byte counts.
  auto measure = [&](const std::map<std::string, std::string>& env) {
    long long eth0 = 0;
    long long eth1 = 0;
    eth0 = traffic(c, 1, "eth0", [&] {
      eth1 = traffic(c, 1, "eth1", [&] {
        JobResult r = run_job(c, 2, env, job);
        for (int i = 0; i < 2; ++i) {
          INFO("node " << i << " stdout: " << r.out[i] << "\nstderr: " << r.err[i]);
          CHECK(r.status[i] == 0);
          CHECK_THAT(r.out[i], Catch::Contains("rank " + std::to_string(i) + ": 1 checks, 0 failed"));
        }
      });
    });
    return std::pair{eth0, eth1};
  };

  // Without it the mesh follows the store (eth0): the counters can tell the two apart.
  const auto [plain0, plain1] = measure({});
  INFO("unset: eth0 " << plain0 << " bytes, eth1 " << plain1 << " bytes");
  CHECK(plain0 >= kPayload);
  CHECK(plain1 < kPayload / 8);

  const auto [chosen0, chosen1] = measure({{"DDP_SOCKET_IFNAME", "eth1"}});
  INFO("eth1: eth0 " << chosen0 << " bytes, eth1 " << chosen1 << " bytes");
  CHECK(chosen1 >= kPayload);
  CHECK(chosen0 < kPayload / 8);  // the store's traffic only

  // The exact-name and exclusion forms choose it too.
  const auto [excl0, excl1] = measure({{"DDP_SOCKET_IFNAME", "^=eth0"}});
  INFO("^=eth0: eth0 " << excl0 << " bytes, eth1 " << excl1 << " bytes");
  CHECK(excl1 >= kPayload);
  CHECK(excl0 < kPayload / 8);
}

TEST_CASE("DDP_SOCKET_IFNAME naming no interface fails the job with the interfaces there are", "[multinode][nic]") {
  NetnsCluster c(NetnsOptions{.nodes = 2, .second_interface = true});
  JobResult r = run_job(c, 2, {{"DDP_SOCKET_IFNAME", "nosuch"}}, {kCollectiveWorker, "sum", "4096"});
  for (int i = 0; i < 2; ++i) {
    INFO("node " << i << " stdout: " << r.out[i] << "\nstderr: " << r.err[i]);
    CHECK(r.status[i] != 0);
  }
  // A worker fails at once in init(), naming the spec and the interfaces its host has
  // (the first to fail may stop the other node's worker before it says so itself).
  int named = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string all = r.out[i] + r.err[i];
    if (all.find("DDP_SOCKET_IFNAME='nosuch' matches no interface that is up with an IPv4 address") ==
        std::string::npos) {
      continue;
    }
    ++named;
    INFO("node " << i << ": " << all);
    CHECK_THAT(all, Catch::Contains("lo (127.0.0.1)") && Catch::Contains("eth0 (" + c.address(i) + ")") &&
                        Catch::Contains("eth1 (" + c.address(i, 1) + ")"));
  }
  INFO("node 0: " << r.out[0] << r.err[0] << "\nnode 1: " << r.out[1] << r.err[1]);
  CHECK(named >= 1);
}

TEST_CASE("what node 0 advertises with --local_addr is the workers' MASTER_ADDR", "[multinode][nic]") {
  // NCCL's own variable rides along untouched.
  ProcessOptions nccl;
  nccl.set_env = {{"NCCL_SOCKET_IFNAME", "^=docker0,lo"}};
  NetnsCluster c(NetnsOptions{.nodes = 2, .second_interface = true});
  TempDir dir;
  write_file(dir / "token", "nic-test-token\n");
  // The store is a daemon's on eth0; node 0 says the others reach it on eth1.
  Process daemon(c.on(0, {kRendezvousBin, "--port=29400", "--token-file", (dir / "token").string()}));
  REQUIRE(daemon.wait_for_stdout([](const std::string& o) { return o.find("listening") != std::string::npos; }, 10s));
  std::vector<std::unique_ptr<Process>> ps;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> a = {e2e::kDdprun, "--nnodes=2", "--node_rank=" + std::to_string(i),
                                  "--nproc_per_node=1", "--rdzv_endpoint=" + c.address(0) + ":29400",
                                  "--rdzv_id=nic", "--rdzv_token_file=" + (dir / "token").string(),
                                  "--join_timeout=30"};
    if (i == 0) a.push_back("--local_addr=" + c.address(0, 1));
    a.insert(a.end(), {e2e::kWorker, "env", "MASTER_ADDR", "NCCL_SOCKET_IFNAME"});
    ps.push_back(std::make_unique<Process>(c.on(i, a), nccl));
  }
  for (int i = 0; i < 2; ++i) {
    auto status = ps[i]->wait(60s);
    INFO("node " << i << " stdout: " << ps[i]->out() << "\nstderr: " << ps[i]->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    const auto lines = e2e::by_rank(ps[i]->out())[i];
    CHECK(std::find(lines.begin(), lines.end(), "MASTER_ADDR=" + c.address(0, 1)) != lines.end());
    CHECK(std::find(lines.begin(), lines.end(), "NCCL_SOCKET_IFNAME=^=docker0,lo") != lines.end());
  }

  // An address this host does not have is refused before anything joins.
  auto foreign = run(c.on(1, {e2e::kDdprun, "--nnodes=2", "--node_rank=1", "--rdzv_endpoint=" + c.address(0) + ":29400",
                              "--rdzv_id=nic2", "--rdzv_token_file=" + (dir / "token").string(),
                              "--local_addr=" + c.address(0, 1), "--join_timeout=5", e2e::kWorker, "env", "RANK"}));
  INFO(foreign.err);
  CHECK(foreign.status == 1);
  CHECK_THAT(foreign.err, Catch::Contains("--local_addr " + c.address(0, 1) + " is not an address of this host"));
  daemon.send_signal(SIGTERM);
  CHECK(daemon.wait(10s).has_value());
}
