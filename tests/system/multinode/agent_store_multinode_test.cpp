// The agent store across hosts: an unmodified PyTorch DDP script (Debian's 1.13,
// gloo) on two network-namespace hosts, its workers' init_process_group served by
// node 0's store (static job) or, beside a ddp-rendezvous daemon, by a torch-only
// store of the group-rank-0 ddprun; no worker listens on MASTER_PORT.
#include <catch2/catch.hpp>

#include <set>

#include "e2e.hpp"
#include "netns.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kRendezvousBin = RENDEZVOUS_BIN;
const std::string kProbe = TESTS_SOURCE_DIR "/launcher/e2e/torch_agent_store_probe.py";
// Debian's torch; gloo on the hosts' link (the shared host name resolves to loopback).
const ProcessOptions kTorchEnv{{{"PYTHON_EXEC", "/usr/bin/python3"}, {"GLOO_SOCKET_IFNAME", "eth0"}}, {}};

std::string field(const std::string& line, const std::string& name) {
  const auto at = line.find(" " + name + "=");
  if (at == std::string::npos) return "?";
  const auto from = at + name.size() + 2;
  return line.substr(from, line.find(' ', from) - from);
}

// Each node's result lines by global rank, once every node ended 0.
std::map<int, std::string> results(std::vector<std::unique_ptr<Process>>& nodes) {
  std::map<int, std::string> out;
  for (auto& n : nodes) {
    auto status = n->wait(120s);
    INFO("stderr: " << n->err() << "\nstdout: " << n->out());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    for (const auto& [rank, lines] : e2e::by_rank(n->out())) {
      for (const auto& l : lines) {
        if (l.rfind("rank=", 0) == 0) out[rank] = l;
      }
    }
  }
  REQUIRE(out.size() == 2);
  return out;
}

std::vector<std::string> node_args(std::vector<std::string> flags) {
  std::vector<std::string> a = {e2e::kDdprun, "--nnodes=2", "--nproc_per_node=1", "--join_timeout=60",
                                "--heartbeat_timeout=5"};
  a.insert(a.end(), flags.begin(), flags.end());
  a.push_back(kProbe);
  return a;
}

}  // namespace

TEST_CASE("agent store: a static job's torch workers use node 0's store on --master_port",
          "[multinode][agent_store][torch]") {
  NetnsCluster c(2);
  std::vector<std::unique_ptr<Process>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Process>(
        c.on(i, node_args({"--node_rank=" + std::to_string(i), "--master_addr=" + c.address(0), "--master_port=29500"})),
        kTorchEnv));
  }
  auto res = results(nodes);
  for (const auto& [rank, line] : res) {
    INFO(line);
    CHECK(field(line, "master_port") == "29500");
    CHECK(field(line, "own_key") == "True");
    CHECK(field(line, "agent_keys") == "False");
    CHECK(field(line, "allreduce") == "3");
  }
  CHECK(field(res[0], "listener") == "launcher");  // node 0's ddprun, not rank 0
  CHECK(field(res[1], "listener") == "nobody");    // nothing listens on node 1
}

TEST_CASE("agent store: beside a ddp-rendezvous daemon the group-rank-0 ddprun serves the torch workers",
          "[multinode][agent_store][torch]") {
  NetnsCluster c(3);
  Process daemon(c.on(2, {kRendezvousBin, "--port=29400", "--heartbeat-timeout=5"}));
  REQUIRE(daemon.wait_for_stdout([](const std::string& s) { return s.find("listening") != std::string::npos; }, 10s));
  std::vector<std::unique_ptr<Process>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Process>(
        c.on(i, node_args({"--node_rank=" + std::to_string(i), "--rdzv_endpoint=" + c.address(2) + ":29400",
                           "--rdzv_id=torchjob"})),
        kTorchEnv));
  }
  auto res = results(nodes);
  std::set<std::string> ports;
  for (const auto& [rank, line] : res) {
    INFO(line);
    ports.insert(field(line, "master_port"));
    CHECK(field(line, "own_key") == "True");
    CHECK(field(line, "agent_keys") == "False");
  }
  REQUIRE(ports.size() == 1);
  CHECK(*ports.begin() != "29400");                // not the daemon: a torch-only store
  CHECK(field(res[0], "listener") == "launcher");  // node 0's ddprun (group rank 0) holds it
  CHECK(field(res[1], "listener") == "nobody");
}
