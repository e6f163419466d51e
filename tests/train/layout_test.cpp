// Model-parallel layouts end to end: layout_checks (make_parallel_mlp against make_mlp,
// memory per rank, checkpoints saved from and loaded into tp4, pp4, pp2 x tp2, dp2 x tp2
// and dp2 x pp2) launched by the real ddprun at 4 ranks; each rank prints what it
// measured and, last, "rank R: N checks, 0 failed" when every check held.
#include <catch2/catch.hpp>
#include <regex>

#include "checks_program.hpp"

using namespace std::chrono_literals;

namespace {
// layout_checks' checks per rank (the same on every rank): building 3 per layout, plus
// the tp refusal (3 layouts with tp > 1) and the pp refusal (pp4); memory 2, saving 3
// and loading 7 per layout; 5 layouts.
constexpr int kLayoutChecks = 5 * 3 + 3 + 1 + 5 * (2 + 3 + 7);
}  // namespace

TEST_CASE("model-parallel layouts at 4 ranks: make_mlp's blocks, bytes per rank, checkpoints across layouts",
          "[model_parallel][layout]") {
  auto c = e2e::run_checks_program(LAYOUT_CHECKS_BIN, 4, 300s, [](int) { return kLayoutChecks; });
  INFO("stdout: " << c.result.out);
  // The figures: per layout, the largest rank's share of the test and the wide model,
  // and whether each saved file is save_checkpoint's.
  const std::regex memory(R"(rank 0: memory \w+ [-\d]+: largest rank holds [\d.]+ of .*)");
  const std::regex identical(R"(rank 0: checkpoint \w+ \w+: byte-identical to save_checkpoint's: yes)");
  int memory_lines = 0, identical_lines = 0;
  for (auto& line : c.ranks[0]) {
    memory_lines += std::regex_match(line, memory) ? 1 : 0;
    identical_lines += std::regex_match(line, identical) ? 1 : 0;
  }
  CHECK(memory_lines == 10);
  CHECK(identical_lines == 10);
}
