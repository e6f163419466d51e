// Sharded data parallel end to end: sharded_checks (ZeRO-1 against DDP) launched by the
// real ddprun at 2 and 3 ranks; each rank prints what it measured and, last,
// "rank R: N checks, 0 failed" when every check held.
#include <catch2/catch.hpp>
#include <regex>
#include <vector>

#include "checks_program.hpp"
#include "e2e.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

// sharded_checks' checks per rank, by world size: ranks differ in what they check about
// checkpoints (the saving 2-rank subgroup's root, its other rank, the ranks outside it).
std::vector<int> expected_checks(int nproc) { return nproc == 2 ? std::vector<int>{71, 71} : std::vector<int>{71, 68, 66}; }

void run_checks(int nproc) {
  auto c = e2e::run_checks_program(SHARDED_CHECKS_BIN, nproc, 600s,
                                   [nproc](int rank) { return expected_checks(nproc).at(static_cast<size_t>(rank)); });
  INFO("stdout: " << c.result.out);
  // The measured figures the checks bounded: 2 models x 2 optimizers x 2 modes.
  const std::regex figure(R"(rank 0: equivalence zero1\(\w+\) \w+ [-\d]+ at \d ranks: max_rel_diff \S+ vs ddp)");
  int figures = 0;
  for (auto& line : c.ranks[0]) figures += std::regex_match(line, figure) ? 1 : 0;
  CHECK(figures == 8);
}

}  // namespace

TEST_CASE("ZeRO-1, 2 ranks: matches DDP exactly, 1/N optimizer state, checkpoints in the unsharded format",
          "[sharded][zero1]") {
  run_checks(2);
}

TEST_CASE("ZeRO-1, 3 ranks: matches DDP exactly with uneven padding, checkpoints load at another world",
          "[sharded][zero1]") {
  run_checks(3);
}
