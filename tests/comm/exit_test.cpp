// The exit cases of the hang matrix, end to end under the real ddprun, on one node
// and across two network-namespace hosts: a rank that is gone (or never comes) fails
// every other rank at once, with an error that names it, how it exited and the call
// that waited for it. Also the "still waiting" notices and the bounds on forming a
// group, with and without ddprun. The worker is exit_worker (see its header).
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <regex>

#include "e2e.hpp"
#include "netns.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kExitWorker = EXIT_WORKER_BIN;
// A generous bound for a loaded 2-core machine; the benchmark measures the real figure.
constexpr double kBoundS = 5.0;

struct Outcome {
  std::map<int, std::vector<std::string>> lines;  // by rank, ddprun's prefix removed
  std::string all;                                // every node's output, for INFO
};

// Runs exit_worker `args` under ddprun with nproc[i] ranks on host i (one host:
// this one; more: network namespaces).
Outcome run_job(const std::vector<int>& nproc, const std::vector<std::string>& args,
                std::map<std::string, std::string> env = {}) {
  ProcessOptions o;
  o.set_env = std::move(env);
  std::vector<std::unique_ptr<Process>> nodes;
  std::unique_ptr<NetnsCluster> cluster;
  const int hosts = static_cast<int>(nproc.size());
  if (hosts == 1) {
    std::vector<std::string> argv{e2e::kDdprun, "--nproc_per_node=" + std::to_string(nproc[0]), kExitWorker};
    argv.insert(argv.end(), args.begin(), args.end());
    nodes.push_back(std::make_unique<Process>(argv, o));
  } else {
    cluster = std::make_unique<NetnsCluster>(hosts);
    for (int i = hosts - 1; i >= 0; --i) {
      std::vector<std::string> argv{e2e::kDdprun,
                                    "--nnodes=" + std::to_string(hosts),
                                    "--node_rank=" + std::to_string(i),
                                    "--master_addr=" + cluster->address(0),
                                    "--master_port=29500",
                                    "--nproc_per_node=" + std::to_string(nproc[static_cast<size_t>(i)]),
                                    "--join_timeout=60",
                                    kExitWorker};
      argv.insert(argv.end(), args.begin(), args.end());
      nodes.push_back(std::make_unique<Process>(cluster->on(i, argv), o));
    }
  }
  Outcome out;
  for (auto& n : nodes) {
    REQUIRE(n->wait(120s).has_value());
    out.all += n->out() + n->err();
    for (auto& [rank, lines] : e2e::by_rank(n->out() + n->err()))
      out.lines[rank].insert(out.lines[rank].end(), lines.begin(), lines.end());
  }
  return out;
}

// The number after `marker` on the first line of `lines` that starts with it.
std::optional<std::pair<double, std::string>> find_line(const std::vector<std::string>& lines,
                                                        const std::string& marker) {
  for (const auto& l : lines)
    if (l.rfind(marker, 0) == 0) {
      size_t used = 0;
      const double t = std::stod(l.substr(marker.size()), &used);
      return std::make_pair(t, l.substr(marker.size() + used));
    }
  return std::nullopt;
}

// Every rank but the victim failed within kBoundS of the victim's exit with a message
// matching `expected` (a regex, searched).
void expect_all_failed(const Outcome& out, int world, int victim, const std::string& expected, int first = 0) {
  INFO(out.all);
  REQUIRE(out.lines.count(victim) == 1);
  const auto exited = find_line(out.lines.at(victim), "EXIT ");
  REQUIRE(exited);
  for (int r = first; r < world; ++r) {
    if (r == victim) continue;
    INFO("rank " << r);
    REQUIRE(out.lines.count(r) == 1);
    const auto error = find_line(out.lines.at(r), "ERROR ");
    REQUIRE(error);
    INFO(error->second);
    CHECK(std::regex_search(error->second, std::regex(expected)));
    CHECK(error->first - exited->first < kBoundS);
    CHECK(error->first - exited->first > -0.1);
  }
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const std::string kClock = R"(\d\d:\d\d:\d\d\.\d\d\d)";

}  // namespace

TEST_CASE("a rank that exits 0 before init fails the others' group formation at once, naming it", "[exits]") {
  const auto out = run_job({3}, {"before_init", "1"});
  expect_all_failed(out, 3, 1,
                    "^ PeerError process group: rank 1 exited with code 0 at " + kClock +
                        R"( on node 0 \(.+\), before joining the process group$)");
}

TEST_CASE("a rank that exits 0 while the others are in a small all_reduce fails them at once", "[exits]") {
  const auto out = run_job({3}, {"in_collective", "2", "4096"});
  expect_all_failed(out, 3, 2,
                    "PeerError all_reduce failed on rank [01]: rank 2 exited with code 0 at " + kClock +
                        R"( on node 0 \(.+\), while this rank waits for it in all_reduce #2 of group 0$)");
}

TEST_CASE("a rank that exits 0 while the others are in a large all_reduce fails them at once", "[exits]") {
  const auto out = run_job({3}, {"in_collective", "0", "8388608"});
  expect_all_failed(out, 3, 0,
                    "PeerError all_reduce failed on rank [12]: rank 0 exited with code 0 at " + kClock +
                        R"(.*, while this rank waits for it in all_reduce #2 of group 0$)");
}

TEST_CASE("each rank names its own call when a peer exits: rank 0 in recv and rank 1 in barrier", "[exits]") {
  const auto out = run_job({3}, {"recv_barrier", "2"});
  INFO(out.all);
  const std::string exited = "rank 2 exited with code 0 at " + kClock + R"( on node 0 \(.+\), while this rank waits for it in )";
  const std::map<int, std::string> calls{{0, "recv #1 of group 0$"}, {1, "barrier #2 of group 0$"}};
  for (const auto& [r, call] : calls) {
    INFO("rank " << r);
    REQUIRE(out.lines.count(r) == 1);
    const auto error = find_line(out.lines.at(r), "ERROR ");
    REQUIRE(error);
    INFO(error->second);
    CHECK(std::regex_search(error->second, std::regex("PeerError \\w+ failed on rank " + std::to_string(r) + ": " + exited + call)));
  }
}

TEST_CASE("a subgroup member that exits fails the subgroup's other members at once", "[exits]") {
  const auto out = run_job({4}, {"subgroup", "2"});
  // Ranks 1..3 form the subgroup; rank 0 is no member and is left alone. Errors name
  // ranks by their global rank (1 and 3), not by their rank in the subgroup (0 and 2).
  expect_all_failed(out, 4, 2,
                    "PeerError all_reduce failed on rank [13]: rank 2 exited with code 0 at " + kClock +
                        R"(.*, while this rank waits for it in all_reduce #1 of group 0\.0$)",
                    1);
  CHECK((out.lines.count(0) == 0 || !find_line(out.lines.at(0), "ERROR ")));
}

TEST_CASE("DDP_TIMEOUT_SEC bounds group formation, and a waiting rank says whom it waits for", "[exits]") {
  // The victim sleeps 10 s, then exits: the others must have failed well before.
  const double started = unix_now();
  const auto out = run_job({3}, {"never", "2"}, {{"DDP_TIMEOUT_SEC", "3"}, {"DDP_WAIT_NOTICE_SEC", "1"}});
  INFO(out.all);
  for (int r : {0, 1}) {
    const auto error = find_line(out.lines.at(r), "ERROR ");
    REQUIRE(error);
    CHECK(error->first - started >= 3.0);
    CHECK(error->first - started < 3.0 + kBoundS);
    CHECK_THAT(error->second, Catch::Contains("Timeout process group: ranks 2 did not join within"));
    bool noticed = false;
    for (const auto& l : out.lines.at(r))
      noticed |= std::regex_search(l, std::regex("^ddp: rank " + std::to_string(r) +
                                                 R"( still waiting for rank 2 to join the process group \(\d s of \d s\)$)"));
    CHECK(noticed);
  }
}

TEST_CASE("across hosts: a rank that exits 0 before init fails the others at once", "[exits][multihost]") {
  const auto out = run_job({2, 2}, {"before_init", "3"});
  expect_all_failed(out, 4, 3,
                    "^ PeerError process group: rank 3 exited with code 0 at " + kClock +
                        R"( on node 1 \(.+\), before joining the process group$)");
}

TEST_CASE("across hosts: a rank that exits 0 in a small all_reduce fails the others at once", "[exits][multihost]") {
  const auto out = run_job({2, 2}, {"in_collective", "2", "4096"});
  expect_all_failed(out, 4, 2,
                    "PeerError all_reduce failed on rank [013]: rank 2 exited with code 0 at " + kClock +
                        R"( on node 1 \(.+\), while this rank waits for it in all_reduce #2 of group 0$)");
}

TEST_CASE("across hosts: a rank that exits 0 in a large all_reduce fails the others at once", "[exits][multihost]") {
  const auto out = run_job({2, 2}, {"in_collective", "1", "8388608"});
  expect_all_failed(out, 4, 1,
                    "rank 1 exited with code 0 at " + kClock +
                        R"( on node 0 \(.+\), while this rank waits for it in all_reduce #2 of group 0$)");
}

TEST_CASE("across hosts: a subgroup member that exits fails the others at once", "[exits][multihost]") {
  const auto out = run_job({2, 2}, {"subgroup", "3"});
  expect_all_failed(out, 4, 3,
                    "PeerError all_reduce failed on rank [12]: rank 3 exited with code 0 at " + kClock +
                        R"( on node 1 \(.+\), while this rank waits for it in all_reduce #1 of group 0\.0$)",
                    1);
}

TEST_CASE("across hosts: DDP_TIMEOUT_SEC bounds formation when a rank never comes", "[exits][multihost]") {
  const double started = unix_now();
  const auto out = run_job({2, 2}, {"never", "3"}, {{"DDP_TIMEOUT_SEC", "3"}});
  INFO(out.all);
  for (int r : {0, 1, 2}) {
    const auto error = find_line(out.lines.at(r), "ERROR ");
    REQUIRE(error);
    CHECK(error->first - started < 3.0 + kBoundS + 2.0);  // + starting two ddprun and joining
    CHECK_THAT(error->second, Catch::Contains("Timeout process group: ranks 3 did not join within"));
  }
}

TEST_CASE("without ddprun an unreachable store gives notices, then a bounded error", "[exits]") {
  // Rank 1 of 2: rank 0 (which would host the store) never comes; the port is refused.
  ProcessOptions o;
  o.set_env = {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(e2e::free_port())},
               {"RANK", "1"},                {"WORLD_SIZE", "2"},
               {"DDP_TIMEOUT_SEC", "3"},     {"DDP_WAIT_NOTICE_SEC", "1"}};
  o.unset_env = {"DDPRUN_STORE_ADDR", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "TORCHELASTIC_RUN_ID"};
  const auto started = std::chrono::steady_clock::now();
  Process p({kExitWorker, "init_only"}, o);
  const auto status = p.wait(60s);
  REQUIRE(status.has_value());
  const auto took = std::chrono::steady_clock::now() - started;
  INFO(p.out() << p.err());
  CHECK(*status == 1);  // init failed
  CHECK(took >= 3s);
  CHECK(took < 3s + std::chrono::seconds(static_cast<int>(kBoundS)));
  CHECK(std::regex_search(p.err(), std::regex(R"(ddp: rank 1 still waiting for the store at 127\.0\.0\.1:\d+: )"
                                              R"(Connection refused \(1 s of 3 s\))")));
  CHECK(std::regex_search(p.out(), std::regex(R"(ERROR [\d.]+ Error cannot reach the store at 127\.0\.0\.1:\d+ )"
                                              R"(within 3 s \(Connection refused\))")));
}
