// Mismatched calls on the CPU backend, with real processes under the real ddprun:
// rank 0 makes another call than the others (op, count, dtype, root, reduce op, a
// skipped call followed by another op, a recv of the wrong size), on the one-exchange
// small path and on large ones, over shared memory, TCP on one host, and TCP between
// two network-namespace hosts, and in a subgroup. Every rank must fail within seconds
// with Mismatch, the same text naming both sides by global rank and their sequence
// numbers; none may return wrong data.
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

struct Case {
  std::string name;   // collective_worker mismatch <name> <count>
  size_t count;
  std::string rank0;  // how the text names rank 0's call
  std::string other;  // and the other side's (rank 1, or rank 2 with 3 ranks)
};

std::vector<Case> cases() {
  return {
      {"all_gather", 256, "all_reduce #2 256×f32 sum", "all_gather #2 256×f32"},
      {"all_gather", 300000, "all_reduce #2 300000×f32 sum", "all_gather #2 300000×f32"},
      {"broadcast", 256, "all_reduce #2 256×f32 sum", "broadcast #2 256×f32 root 0"},
      {"broadcast", 1000000, "all_reduce #2 1000000×f32 sum", "broadcast #2 1000000×f32 root 0"},
      {"count", 256, "all_reduce #2 256×f32 sum", "all_reduce #2 1024×f32 sum"},
      {"count", 262144, "all_reduce #2 262144×f32 sum", "all_reduce #2 1048576×f32 sum"},
      {"dtype", 256, "all_reduce #2 256×f32 sum", "all_reduce #2 256×i32 sum"},
      {"root", 256, "broadcast #2 256×f32 root 0", "broadcast #2 256×f32 root 1"},
      {"reduce_op", 256, "all_reduce #2 256×f32 sum", "all_reduce #2 256×f32 max"},
      // Caught because the barrier after the skipped call differs (see collective_worker).
      {"skip_then_barrier", 256, "barrier #3", "all_reduce #3 256×f32 sum"},
      {"p2p", 100, "send #1 100×u8 to 1", "recv #1 99×u8 from 0"},
  };
}

// Checks one rank's output: one Mismatch within 5 s naming both sides (`first`: how
// the text starts, up to the odd rank's call); a call that returned first returned
// right data.
void check_rank(int rank, const std::vector<std::string>& lines, const Case& k,
                const std::string& first = "mismatched calls in group 0: rank 0: ",
                const std::string& other = "rank [12]: ") {
  INFO("case " << k.name << " " << k.count << ", rank " << rank);
  const std::regex failed("rank " + std::to_string(rank) + R"(: Mismatch after ([\d.]+) s: (.*))");
  int mismatches = 0;
  for (const auto& line : lines) {
    INFO(line);
    CHECK(line.find("WRONG") == std::string::npos);
    CHECK(line.find("went unnoticed") == std::string::npos);
    CHECK(line.find("other error") == std::string::npos);
    std::smatch m;
    if (!std::regex_match(line, m, failed)) continue;
    ++mismatches;
    CHECK(std::stod(m[1]) < 5.0);
    const std::string want = first + k.rank0 + "; " + other;
    CHECK(std::regex_match(std::string(m[2]), std::regex(want + k.other)));
  }
  CHECK(mismatches == 1);
}

void run_case(int n, const Case& k, std::map<std::string, std::string> env) {
  ProcessOptions o;
  o.set_env = std::move(env);
  auto r = run(e2e::ddprun({"--nproc_per_node=" + std::to_string(n), kCollectiveWorker, "mismatch", k.name,
                            std::to_string(k.count)}),
               o, 120s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(static_cast<int>(ranks.size()) == n);
  for (auto& [rank, lines] : ranks) check_rank(rank, lines, k);
}

}  // namespace

TEST_CASE("mismatched calls: 2 ranks on shared memory all fail at once naming both sides", "[collectives][mismatch]") {
  for (const auto& k : cases()) run_case(2, k, {});
}

TEST_CASE("mismatched calls: 3 ranks on shared memory all fail at once naming both sides", "[collectives][mismatch]") {
  for (const auto& k : cases()) run_case(3, k, {});
}

TEST_CASE("mismatched calls: 3 ranks over TCP (DDP_DISABLE_SHM=1) all fail at once", "[collectives][mismatch]") {
  for (const auto& k : cases()) run_case(3, k, {{"DDP_DISABLE_SHM", "1"}});
}

TEST_CASE("mismatched calls through group memory and the staged path are caught before any buffer is touched",
          "[collectives][mismatch]") {
  // A large count mismatch on the direct paths: without single-copy reads (staged)
  // and with them; the group-memory variant is ddp-bench's -g below.
  for (const std::string cma_off : {"0", "1"})
    run_case(3, {"count", 262144, "all_reduce #2 262144×f32 sum", "all_reduce #2 1048576×f32 sum"},
             {{"DDP_DISABLE_CMA", cma_off}});
}

TEST_CASE("a rank that skips a call before another op (ddp-bench -w 1-RANK): no wrong data, both sides named",
          "[collectives][mismatch]") {
  // Rank 1 skips a warm-up all_reduce; caught where rank 0's last all_reduce meets rank
  // 1's closing barrier. A skip before a call of the same shape is not caught at once
  // (calls pair by order): see ProcessGroup's contract.
  for (const std::string size : {"1K", "4M"}) {
    for (const bool group_memory : {false, true}) {
      std::string cmd = std::string(DDP_BENCH_BIN) + " -b " + size + " -e " + size + " -w $((1-RANK)) -o all_reduce";
      if (group_memory) cmd += " -R 1";
      auto r = run(e2e::ddprun({"--nproc_per_node=2", "sh", "-c", cmd}), {}, 120s);
      INFO(size << (group_memory ? " in group memory" : "") << "\nstdout: " << r.out << "\nstderr: " << r.err);
      CHECK(r.status != 0);
      CHECK(std::regex_search(r.err, std::regex(R"(mismatched calls in group 0: rank 0: all_reduce #2 \d+×f32 sum; rank 1: barrier #2)")));
    }
  }
}

TEST_CASE("mismatched calls in a subgroup name global ranks", "[collectives][mismatch]") {
  // Group 0.1 holds global ranks 2 and 3 (group ranks 0 and 1).
  for (const auto& env : std::vector<std::map<std::string, std::string>>{{}, {{"DDP_DISABLE_SHM", "1"}}}) {
    for (const Case& k : {Case{"count", 256, "all_reduce #2 256×f32 sum", "all_reduce #2 1024×f32 sum"},
                          Case{"all_gather", 300000, "all_reduce #2 300000×f32 sum", "all_gather #2 300000×f32"}}) {
      ProcessOptions o;
      o.set_env = env;
      auto r = run(e2e::ddprun({"--nproc_per_node=4", kCollectiveWorker, "mismatch_in_subgroup", k.name,
                                std::to_string(k.count)}),
                   o, 120s);
      INFO("stdout: " << r.out << "\nstderr: " << r.err);
      CHECK(r.status == 0);
      auto ranks = e2e::by_rank(r.out);
      REQUIRE(ranks.size() == 2);
      for (auto& [rank, lines] : ranks) {
        CHECK((rank == 2 || rank == 3));
        check_rank(rank, lines, k, "mismatched calls in group 0.1: rank 2: ", "rank 3: ");
      }
    }
  }
}

TEST_CASE("mismatched calls across two hosts (TCP between network namespaces) all fail at once",
          "[collectives][mismatch][multihost]") {
  NetnsCluster c(2);
  int port = 29700;
  for (const auto& k : cases()) {
    std::vector<std::unique_ptr<Process>> nodes;
    for (int i = 1; i >= 0; --i) {
      nodes.push_back(std::make_unique<Process>(c.on(
          i, {e2e::kDdprun, "--nnodes=2", "--node_rank=" + std::to_string(i), "--master_addr=" + c.address(0),
              "--master_port=" + std::to_string(port), "--nproc_per_node=1", "--join_timeout=60", kCollectiveWorker,
              "mismatch", k.name, std::to_string(k.count)})));
    }
    ++port;
    for (int i = 0; i < 2; ++i) {
      auto status = nodes[static_cast<size_t>(i)]->wait(120s);
      const std::string out = nodes[static_cast<size_t>(i)]->out();
      INFO("host " << 1 - i << " stdout: " << out << "\nstderr: " << nodes[static_cast<size_t>(i)]->err());
      REQUIRE(status.has_value());
      CHECK(*status == 0);
      auto ranks = e2e::by_rank(out);
      REQUIRE(ranks.size() == 1);
      for (auto& [rank, lines] : ranks) check_rank(rank, lines, k);
    }
  }
}
