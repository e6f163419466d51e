// Tensor parallelism end to end: tensor_parallel_checks (the device mesh and the
// column/row layers against the unsplit model, checked inside real ranks) launched by
// the real ddprun at 2 and 4 ranks.
#include <catch2/catch.hpp>

#include "checks_program.hpp"
#include "e2e.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

// tensor_parallel_checks' checks and printed differences per rank, by world size.
int expected_checks(int nproc) { return nproc == 4 ? 208 : 127; }
int expected_compared(int nproc) { return nproc == 4 ? 48 : 24; }

void run_checks(int nproc) {
  auto c = e2e::run_checks_program(TP_CHECKS_BIN, nproc, 240s, [nproc](int) { return expected_checks(nproc); });
  INFO("stdout: " << c.result.out);
  e2e::check_rel_diffs(c, 1e-6, expected_compared(nproc));  // against the unsplit model
}

}  // namespace

TEST_CASE("tensor parallelism, 2 ranks: mesh groups, column/row layers and a TP MLP equal the unsplit model", "[tp]") {
  run_checks(2);
}

TEST_CASE("tensor parallelism, 4 ranks: meshes with pp dp tp, tp 2 and tp 4 equal the unsplit model", "[tp]") {
  run_checks(4);
}
