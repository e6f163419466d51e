// Collectives across real hosts: network namespaces joined by veth links, one
// ddprun per host. One rank per host exercises the TCP mesh; several ranks per host
// the hierarchical path (shared memory inside a host, TCP between hosts).
#include <catch2/catch.hpp>
#include <memory>
#include <regex>

#include "e2e.hpp"
#include "netns.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kCollectiveWorker = COLLECTIVE_WORKER_BIN;

// Runs the matrix with nproc[i] ranks on host i; every rank must pass every check.
void run_matrix_on_hosts(const std::vector<int>& nproc, const std::string& big) {
  const int hosts = static_cast<int>(nproc.size());
  NetnsCluster c(hosts);
  std::vector<std::unique_ptr<Process>> nodes;
  for (int i = hosts - 1; i >= 0; --i) {
    nodes.push_back(std::make_unique<Process>(c.on(
        i, {e2e::kDdprun, "--nnodes=" + std::to_string(hosts), "--node_rank=" + std::to_string(i),
            "--master_addr=" + c.address(0), "--master_port=29500", "--nproc_per_node=" + std::to_string(nproc[i]),
            "--join_timeout=60", kCollectiveWorker, "matrix", "--big", big})));
  }
  std::reverse(nodes.begin(), nodes.end());
  int world = 0;
  for (int n : nproc) world += n;
  std::map<int, std::string> last_line;
  for (int i = 0; i < hosts; ++i) {
    auto status = nodes[i]->wait(900s);
    const std::string out = nodes[i]->out();
    INFO("host " << i << " stdout: " << out.substr(out.size() > 3000 ? out.size() - 3000 : 0)
                 << "\nstderr: " << nodes[i]->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    for (auto& [rank, lines] : e2e::by_rank(out))
      if (!lines.empty()) last_line[rank] = lines.back();
  }
  REQUIRE(static_cast<int>(last_line.size()) == world);
  for (auto& [rank, line] : last_line) {
    INFO("rank " << rank << ": " << line);
    CHECK(std::regex_match(line, std::regex("rank " + std::to_string(rank) + R"(: \d+ checks, 0 failed)")));
  }
}

}  // namespace

TEST_CASE("2 hosts x 1 rank: the matrix passes over TCP between hosts", "[collectives][multihost]") {
  run_matrix_on_hosts({1, 1}, "1048576");
}

TEST_CASE("2 hosts x 2 ranks: the matrix passes with hierarchical reduction", "[collectives][multihost]") {
  run_matrix_on_hosts({2, 2}, "1048576");
}

TEST_CASE("hosts with 3 and 1 ranks: uneven hosts pass the matrix", "[collectives][multihost]") {
  run_matrix_on_hosts({3, 1}, "100003");
}

TEST_CASE("a dead peer on another host fails the others within 2 s naming it", "[collectives][multihost][failure]") {
  NetnsCluster c(2);
  const int port = 29600;
  // Ranks 0 and 1 on host 0, ranks 2 and 3 on host 1; rank 3 dies.
  std::vector<std::unique_ptr<Process>> ps;
  for (int r = 0; r < 4; ++r) {
    ProcessOptions o;
    o.set_env = {{"MASTER_ADDR", c.address(0)},         {"MASTER_PORT", std::to_string(port)},
                 {"RANK", std::to_string(r)},            {"WORLD_SIZE", "4"},
                 {"LOCAL_RANK", std::to_string(r % 2)},  {"LOCAL_WORLD_SIZE", "2"}};
    o.unset_env = {"DDPRUN_STORE_ADDR", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "TORCHELASTIC_RUN_ID"};
    ps.push_back(std::make_unique<Process>(c.on(r / 2, {kCollectiveWorker, "die", "3"}), o));
  }
  for (auto& p : ps) REQUIRE(p->wait(60s).has_value());
  auto number_after = [](const std::string& text, const std::string& marker) {
    auto p = text.find(marker);
    REQUIRE(p != std::string::npos);
    return std::stod(text.substr(p + marker.size()));
  };
  const double died = number_after(ps[3]->out(), "dying at ");
  for (int r = 0; r < 3; ++r) {
    const std::string out = ps[r]->out();
    INFO("rank " << r << " stdout: " << out << "\nstderr: " << ps[r]->err());
    CHECK(out.find("PeerError rank=3 ") != std::string::npos);
    CHECK(out.find("rank 3 (pid") != std::string::npos);
    CHECK(number_after(out, " at ") - died < 2.0);
  }
}
