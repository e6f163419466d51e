// FullyShardedDataParallel end to end: fsdp_checks (the mechanism's promises, checked
// inside real ranks) launched by the real ddprun at 1, 2 and 3 ranks (3 splits the odd
// 13-37-29-5 model's units unevenly, so padding is exercised).
#include <catch2/catch.hpp>
#include <regex>

#include "checks_program.hpp"
#include "e2e.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

constexpr int kChecks = 89;     // fsdp_checks' checks per rank
constexpr int kCompared = 30;   // its printed differences from DDP per rank

void run_checks(int nproc) {
  auto c = e2e::run_checks_program(FSDP_CHECKS_BIN, nproc, 300s, [](int) { return kChecks; });
  INFO("stdout: " << c.result.out);
  // FSDP against DDP: within 1e-6 relative; the equivalence runs check inside that they are exact.
  e2e::check_rel_diffs(c, 1e-6, kCompared);
}

}  // namespace

TEST_CASE("FSDP mechanism, 2 ranks: equivalence with DDP, summon_full_params, memory, overlap, errors", "[fsdp]") {
  run_checks(2);
}

TEST_CASE("FSDP mechanism, 1 rank: the same promises hold alone (gathers and reduce-scatters are copies)", "[fsdp]") {
  run_checks(1);
}

TEST_CASE("FSDP mechanism, 3 ranks: the same promises with uneven shards and padding", "[fsdp]") { run_checks(3); }
