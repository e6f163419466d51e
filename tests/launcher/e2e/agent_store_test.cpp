// The agent store: ddprun serves its PyTorch workers' TCPStore on MASTER_PORT
// (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun 2.x), so an unmodified DDP script
// connects as a client, no worker listens there, and a restart runs on the same port.
// Debian's python3-torch (1.13) is the client.
#include <catch2/catch.hpp>

#include <set>

#include "e2e.hpp"

using namespace testing;

namespace {

const char* kSystemPython = "/usr/bin/python3";
const char* kProbe = TESTS_SOURCE_DIR "/launcher/e2e/torch_agent_store_probe.py";

void require_torch() {
  auto check = run({kSystemPython, "-c", "import torch, torch.distributed; print(torch.__version__)"});
  INFO("python3-torch is required for this test (scripts/setup installs it): " << check.err);
  REQUIRE(check.status == 0);
}

// The probe's last line per rank (its result), checked for what every rank must say.
std::map<int, std::string> results(const std::string& out, int nproc) {
  std::map<int, std::string> last;
  for (auto& [rank, lines] : e2e::by_rank(out)) {
    for (const auto& line : lines) {
      if (line.rfind("rank=", 0) == 0) last[rank] = line;
    }
  }
  REQUIRE(static_cast<int>(last.size()) == nproc);
  return last;
}

std::string field(const std::string& line, const std::string& name) {
  const auto at = line.find(" " + name + "=");
  REQUIRE(at != std::string::npos);
  const auto from = at + name.size() + 2;
  return line.substr(from, line.find(' ', from) - from);
}

}  // namespace

TEST_CASE("a PyTorch DDP script runs on ddprun's agent store, and no worker listens on MASTER_PORT",
          "[e2e][python][torch][agent_store]") {
  require_torch();
  const std::string port = std::to_string(e2e::free_port());
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--master_port=" + port, kProbe}),
               {{{"PYTHON_EXEC", kSystemPython}}, {}}, 180s);
  INFO(r.err);
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto last = results(r.out, 2);
  std::set<std::string> checksums;
  for (auto& [rank, line] : last) {
    CHECK(field(line, "attempt") == "0");
    CHECK(field(line, "master_port") == port);
    CHECK(field(line, "listener") == "launcher");  // ddprun holds it, no worker
    CHECK(field(line, "own_key") == "True");
    CHECK(field(line, "agent_keys") == "False");  // the agents' namespace is out of reach
    CHECK(field(line, "allreduce") == "3");
    checksums.insert(field(line, "checksum"));
  }
  CHECK(checksums.size() == 1);  // DDP kept the replicas equal
}

TEST_CASE("rank 0 killed after init under --max_restarts 1: attempt 1 runs on the same MASTER_PORT",
          "[e2e][python][torch][agent_store]") {
  require_torch();
  const std::string port = std::to_string(e2e::free_port());
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--master_port=" + port, "--max_restarts=1",
                            "--monitor_interval=0.1", kProbe, "--kill-rank0-attempt", "0"}),
               {{{"PYTHON_EXEC", kSystemPython}}, {}}, 240s);
  INFO(r.err);
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.err + r.out, !Catch::Contains("Address already in use"));
  auto last = results(r.out, 2);
  for (auto& [rank, line] : last) {
    CHECK(field(line, "attempt") == "1");
    CHECK(field(line, "master_port") == port);
    CHECK(field(line, "listener") == "launcher");
    CHECK(field(line, "own_key") == "True");
    CHECK(field(line, "earlier_key") == "False");  // attempt 0's keys stayed in attempt 0's namespace
    CHECK(field(line, "agent_keys") == "False");   // attempt/0/exits exists, for the agents only
  }
}

TEST_CASE("the switch back (--no_agent_store): the same script with rank 0's own store on MASTER_PORT",
          "[e2e][python][torch][agent_store]") {
  require_torch();
  const std::string port = std::to_string(e2e::free_port());
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--master_port=" + port, "--no_agent_store",
                            TESTS_SOURCE_DIR "/launcher/e2e/torch_ddp_probe.py"}),
               {{{"PYTHON_EXEC", kSystemPython}}, {}}, 180s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks[0].size() == 1);
  CHECK_THAT(ranks[0][0], Catch::StartsWith("rank=0 world=2 allreduce=3 checksum="));
}
