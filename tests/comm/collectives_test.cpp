// The CPU backend's collectives with real processes on one host: under the real
// ddprun (shared memory; and TCP only), as plain processes with torchrun-style
// variables (rank 0 hosts the store), under mpirun; and what happens when a peer
// dies or hangs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <regex>

#include "e2e.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kCollectiveWorker = COLLECTIVE_WORKER_BIN;

// Whether ranks of one job can map each other's memory: Yama, where present, must
// not restrict ptrace to descendants, and memfd_create and pidfd_getfd must exist
// (kernel 5.6; not blocked by seccomp). Tried on this process itself.
bool can_share_memory() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if ((f >> scope) && scope != 0) return false;
  const int mem = ::memfd_create("probe", MFD_CLOEXEC);
  const int self = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  const int dup = mem >= 0 && self >= 0 ? static_cast<int>(::syscall(SYS_pidfd_getfd, self, mem, 0)) : -1;
  for (int fd : {mem, self, dup})
    if (fd >= 0) ::close(fd);
  return dup >= 0;
}

// Runs the check matrix with `n` ranks under ddprun; every rank must report
// "0 failed" and the job must exit 0. Group memory must be shared exactly when the
// ranks share a host and may map each other's memory.
void run_matrix(int n, const std::string& big, std::map<std::string, std::string> env = {}) {
  const bool shared = n > 1 && !env.contains("DDP_DISABLE_SHM") && !env.contains("DDP_DISABLE_CMA") &&
                      can_share_memory();
  ProcessOptions o;
  o.set_env = std::move(env);
  auto r = run(e2e::ddprun({"--nproc_per_node=" + std::to_string(n), kCollectiveWorker, "matrix", "--big", big}), o,
               900s);
  INFO("stdout: " << r.out.substr(r.out.size() > 4000 ? r.out.size() - 4000 : 0) << "\nstderr: " << r.err);
  CHECK(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(static_cast<int>(ranks.size()) == n);
  for (auto& [rank, lines] : ranks) {
    REQUIRE(lines.size() >= 2);
    CHECK(lines[lines.size() - 2] == "rank " + std::to_string(rank) + ": group memory shared=" + (shared ? "1" : "0"));
    std::smatch m;
    REQUIRE(std::regex_match(lines.back(), m, std::regex(R"(rank (\d+): (\d+) checks, 0 failed)")));
    CHECK(std::stoi(m[1]) == rank);
    CHECK(std::stoi(m[2]) > 500);
  }
}

// `n` plain processes with torchrun-style variables (no launcher at all).
std::vector<std::unique_ptr<Process>> start_plain(int n, const std::vector<std::string>& args,
                                                  std::map<std::string, std::string> extra = {}) {
  const int port = e2e::free_port();
  std::vector<std::unique_ptr<Process>> ps;
  for (int r = 0; r < n; ++r) {
    ProcessOptions o;
    o.set_env = extra;
    o.set_env["MASTER_ADDR"] = "127.0.0.1";
    o.set_env["MASTER_PORT"] = std::to_string(port);
    o.set_env["RANK"] = std::to_string(r);
    o.set_env["WORLD_SIZE"] = std::to_string(n);
    o.set_env["LOCAL_RANK"] = std::to_string(r);
    o.set_env["LOCAL_WORLD_SIZE"] = std::to_string(n);
    o.unset_env = {"DDPRUN_STORE_ADDR", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "TORCHELASTIC_RUN_ID"};
    std::vector<std::string> argv{kCollectiveWorker};
    argv.insert(argv.end(), args.begin(), args.end());
    ps.push_back(std::make_unique<Process>(argv, o));
  }
  return ps;
}

double number_after(const std::string& text, const std::string& marker) {
  auto p = text.find(marker);
  REQUIRE(p != std::string::npos);
  return std::stod(text.substr(p + marker.size()));
}

// Rank `victim` of `n` plain processes SIGKILLs itself during an all_reduce; every
// other rank must fail with a PeerError naming it within 2 s.
void dead_peer(int n, int victim, std::map<std::string, std::string> env = {}) {
  auto ps = start_plain(n, {"die", std::to_string(victim)}, std::move(env));
  for (auto& p : ps) REQUIRE(p->wait(60s).has_value());
  const double died = number_after(ps[victim]->out(), "dying at ");
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const std::string out = ps[r]->out();
    INFO("rank " << r << " stdout: " << out << "\nstderr: " << ps[r]->err());
    CHECK(out.find("PeerError rank=" + std::to_string(victim) + " ") != std::string::npos);
    CHECK(out.find("rank " + std::to_string(victim) + " (pid") != std::string::npos);
    const double seen = number_after(out, " at ");
    CHECK(seen - died < 2.0);
    CHECK(seen - died >= 0.0);
    CHECK(out.find("then ") != std::string::npos);  // the group stays broken
  }
}

}  // namespace

// World sizes 1..6 and 8 on one host: shared memory between every pair. Every size up to 6
// (the primes 3 and 5 give uneven chunks) and 8, four ranks per core here; 7 added nothing
// the others do not cover and took half a minute of CI.
TEST_CASE("1 rank: every collective x dtype x op x count matches the serial reference", "[collectives]") { run_matrix(1, "1048576"); }
TEST_CASE("2 ranks: every collective x dtype x op x count matches the serial reference", "[collectives]") { run_matrix(2, "1048576"); }
TEST_CASE("3 ranks: every collective x dtype x op x count matches the serial reference", "[collectives]") { run_matrix(3, "1048576"); }
TEST_CASE("4 ranks: every collective x dtype x op x count matches the serial reference", "[collectives]") { run_matrix(4, "1048576"); }
TEST_CASE("5 ranks: every collective x dtype x op x count matches the serial reference", "[collectives]") { run_matrix(5, "1048576"); }
TEST_CASE("6 ranks: every collective x dtype x op x count matches the serial reference", "[collectives]") { run_matrix(6, "1048576"); }
TEST_CASE("8 ranks: every collective x dtype x op x count matches the serial reference", "[collectives]") { run_matrix(8, "1048576"); }

TEST_CASE("ddp-bench under ddprun: every op it measures gives every rank the right result", "[collectives][bench]") {
  // 3 ranks: block sizes that do not divide evenly; -c checks each size on every rank
  // with rank- and position-dependent inputs.
  auto r = run(e2e::ddprun({"--nproc_per_node=3", DDP_BENCH_BIN, "-b", "8", "-e", "1M", "-f", "16", "-o", "all",
                            "-c", "1", "--target_ms", "5"}),
               {}, 120s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks.contains(0));
  std::map<std::string, int> rows;
  const std::regex row(R"(\s*(\w+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+))");
  for (const auto& line : ranks[0]) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    ++rows[m[1]];
    CHECK(m[3] == "0");  // ranks that saw a wrong value, summed over the group
  }
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}) {
    CHECK(rows[op] == 5);  // 8 B to 1 MiB by 16x: 8, 128, 2048, 32768, 524288 (block ops: multiples of 12)
  }
}

TEST_CASE("ddp-bench measures each size once where small sizes round alike", "[collectives][bench]") {
  // 3 ranks: all_gather rounds to multiples of 12 B, so 4, 8 and 16 B are all 12 B.
  auto r = run(e2e::ddprun({"--nproc_per_node=3", DDP_BENCH_BIN, "-b", "4", "-e", "64", "-f", "2", "-o", "all_gather",
                            "--target_ms", "1"}),
               {}, 120s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  std::vector<std::string> sizes;
  const std::regex row(R"(\s*all_gather\s+(\d+)\s+.*)");
  auto ranks = e2e::by_rank(r.out);
  for (const auto& line : ranks[0]) {
    std::smatch m;
    if (std::regex_match(line, m, row)) sizes.push_back(m[1]);
  }
  CHECK(sizes == std::vector<std::string>{"12", "24", "60"});
  CHECK(r.out.find("host buffers") != std::string::npos);  // the banner says what it measures
}

TEST_CASE("TCP only (DDP_DISABLE_SHM=1): the 4-rank matrix passes over sockets", "[collectives]") {
  run_matrix(4, "1048576", {{"DDP_DISABLE_SHM", "1"}});
}

TEST_CASE("staged all-reduce: every large all-reduce meets in the staging areas, piece by piece", "[collectives]") {
  // Single-copy off: every all-reduce from 4 KiB up takes the staged path, over several 1 MiB pieces
  // and a last, partial one.
  run_matrix(3, "300007", {{"DDP_STAGED_ALLREDUCE_BYTES", "1073741824"}, {"DDP_DIRECT_ALLREDUCE_BYTES", "4096"},
                           {"DDP_DISABLE_CMA", "1"}});
}

TEST_CASE("small shared-memory rings: messages far larger than the ring still pass", "[collectives]") {
  // Without single-copy reads, so all-reduces from 1 MiB go through the rings too.
  run_matrix(3, "300007", {{"DDP_SHM_RING_BYTES", "4096"}, {"DDP_DISABLE_CMA", "1"}});
}

TEST_CASE("without a launcher: torchrun-style variables and rank 0 hosts the store", "[collectives]") {
  auto ps = start_plain(3, {"matrix", "--big", "10007"});
  for (int r = 0; r < 3; ++r) {
    auto status = ps[r]->wait(300s);
    INFO("rank " << r << " stdout: " << ps[r]->out() << "\nstderr: " << ps[r]->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    CHECK(ps[r]->out().find("rank " + std::to_string(r) + ": ") != std::string::npos);
    CHECK(ps[r]->out().find(" 0 failed") != std::string::npos);
  }
}

TEST_CASE("under mpirun: ranks from OMPI_COMM_WORLD variables and the store port from the job id", "[collectives]") {
  auto r = run({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", kCollectiveWorker, "matrix", "--big",
                "10007"},
               {}, 300s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(r.out.find("rank " + std::to_string(rank) + ": ") != std::string::npos);
  }
  CHECK(r.out.find("FAILED") == std::string::npos);
}

TEST_CASE("a missing launcher variable is named", "[collectives]") {
  ProcessOptions o;
  o.set_env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  o.unset_env = {"MASTER_ADDR", "MASTER_PORT", "DDPRUN_STORE_ADDR", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"};
  auto r = run({kCollectiveWorker, "matrix"}, o, 30s);
  CHECK(r.status == 2);
  CHECK(r.err.find("MASTER_ADDR is not set") != std::string::npos);
}

TEST_CASE("a dead peer (shared memory) fails every other rank within 2 s naming it", "[collectives][failure]") {
  dead_peer(4, 2);
}

TEST_CASE("a dead peer (TCP) fails every other rank within 2 s naming it", "[collectives][failure]") {
  dead_peer(3, 1, {{"DDP_DISABLE_SHM", "1"}});
}

TEST_CASE("a peer that is alive but stuck fails the others at the timeout", "[collectives][failure]") {
  auto ps = start_plain(3, {"stuck", "2"}, {{"DDP_TIMEOUT_SEC", "1"}});
  for (int r = 0; r < 2; ++r) {
    REQUIRE(ps[r]->wait(60s).has_value());
    const std::string out = ps[r]->out();
    INFO("rank " << r << " stdout: " << out << "\nstderr: " << ps[r]->err());
    const double after = number_after(out, "error after ");
    CHECK(after >= 0.9);
    CHECK(after < 5.0);
    // The rank that timed out says so; one that heard it from that rank first
    // (and found the store gone with it) names the stuck rank as reported.
    const bool named = out.find("no progress from rank 2 (pid") != std::string::npos ||
                       out.find("rank 2 (pid") != std::string::npos && out.find("reported by rank") != std::string::npos;
    CHECK(named);
  }
}

TEST_CASE("ranks that disagree on a large all-reduce's count are all refused, with or without single-copy reads",
          "[collectives][failure]") {
  for (const std::string cma_off : {"0", "1"}) {
    auto ps = start_plain(3, {"disagree"}, {{"DDP_DISABLE_CMA", cma_off}});
    for (int r = 0; r < 3; ++r) {
      auto status = ps[r]->wait(60s);
      const std::string out = ps[r]->out();
      INFO("DDP_DISABLE_CMA=" << cma_off << " rank " << r << " stdout: " << out << "\nstderr: " << ps[r]->err());
      REQUIRE(status.has_value());
      CHECK(*status == 0);
      CHECK(out.find("rank " + std::to_string(r) +
                     ": refused: mismatched calls in group 0: rank 0: all_reduce #2 100000×f32 sum; rank ") !=
            std::string::npos);
    }
  }
}

TEST_CASE("caller mistakes: refused up front or the group breaks on every rank", "[collectives][failure]") {
  auto ps = start_plain(3, {"misuse"});
  for (int r = 0; r < 3; ++r) {
    auto status = ps[r]->wait(60s);
    const std::string out = ps[r]->out();
    INFO("rank " << r << " stdout: " << out << "\nstderr: " << ps[r]->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    CHECK(out.find("rank " + std::to_string(r) + ": still usable") != std::string::npos);
    CHECK(out.find("rank " + std::to_string(r) + ": broken: ") != std::string::npos);
  }
  CHECK(ps[0]->out().find("refused: all_gather: output holds 3 elements") != std::string::npos);
  CHECK(ps[1]->out().find("rank 0: send #1 100×u8 to 1; rank 1: recv #1 80×u8 from 0") != std::string::npos);
}
