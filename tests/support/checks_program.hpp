// Running a "checks program" (ddp_checks, sharded_checks, fsdp_checks) under the real
// ddprun: each rank prints what it measured and, last, "rank R: N checks, 0 failed" when
// every check held. Needs Catch2 (it asserts) and DDPRUN_BIN.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "e2e.hpp"
#include "subprocess.hpp"

namespace e2e {

struct ChecksRun {
  testing::RunResult result;
  std::map<int, std::vector<std::string>> ranks;  // each rank's lines, prefix removed
};

// Launches `program` on `nproc` ranks and checks that it exits 0 and that rank R's last
// line reports expected_checks(R) checks, none failed. The caller checks the figures.
inline ChecksRun run_checks_program(const std::string& program, int nproc, std::chrono::seconds timeout,
                                    const std::function<int(int rank)>& expected_checks) {
  ChecksRun c{testing::run({kDdprun, "--nproc_per_node=" + std::to_string(nproc), program}, {}, timeout), {}};
  INFO("stdout: " << c.result.out << "\nstderr: " << c.result.err);
  CHECK(c.result.status == 0);
  c.ranks = by_rank(c.result.out);
  REQUIRE(static_cast<int>(c.ranks.size()) == nproc);
  for (auto& [rank, lines] : c.ranks) {
    REQUIRE(!lines.empty());
    std::smatch m;
    REQUIRE(std::regex_match(lines.back(), m, std::regex(R"(rank (\d+): (\d+) checks, 0 failed)")));
    CHECK(std::stoi(m[1]) == rank);
    CHECK(std::stoi(m[2]) == expected_checks(rank));
  }
  return c;
}

// Checks every "... max_rel_diff X" line of each rank against `bound` and that each rank
// printed `expected` of them (a figure the program stopped printing is a failure too).
inline void check_rel_diffs(const ChecksRun& c, double bound, int expected) {
  const std::regex diff(R"(.*max_rel_diff ([0-9.e+-]+|inf|nan).*)");
  for (auto& [rank, lines] : c.ranks) {
    int compared = 0;
    std::smatch m;
    for (auto& l : lines) {
      if (!std::regex_match(l, m, diff)) continue;
      ++compared;
      INFO("rank " << rank << ": " << l);
      CHECK(std::stod(m[1]) <= bound);
    }
    CHECK(compared == expected);
  }
}

}  // namespace e2e
