// Pipeline stages and schedules end to end: pipeline_checks (see its header) launched by
// the real ddprun at 2 and 4 ranks, every rank a stage: equivalence with the unsplit
// model, the step stats, small batches; and its failure modes, where one stage exits or
// cuts batches differently and every other stage must fail at once, naming its stage and
// micro-batch.
#include <catch2/catch.hpp>
#include <algorithm>
#include <optional>
#include <regex>

#include "checks_program.hpp"
#include "e2e.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

// pipeline_checks' checks and printed differences from the unsplit model per rank (at 4
// ranks also dp2 x pp2).
int checks(int nproc) { return nproc == 4 ? 66 : 58; }
size_t compared(int nproc) { return nproc == 4 ? 8 : 6; }
constexpr double kBoundS = 5.0;  // every rank fails within this of the first event (a loaded 2-core machine)

// The figures a rank printed: each "max_rel_diff X (accumulated: bit-identical)".
std::vector<double> differences(const std::vector<std::string>& lines) {
  static const std::regex diff(R"(.*max_rel_diff ([0-9.e+-]+|inf|nan) \(accumulated: bit-identical\).*)");
  std::vector<double> out;
  std::smatch m;
  for (const auto& l : lines)
    if (std::regex_match(l, m, diff)) out.push_back(std::stod(m[1]));
  return out;
}

void run_checks(int nproc) {
  auto c = e2e::run_checks_program(PIPELINE_CHECKS_BIN, nproc, 300s, [nproc](int) { return checks(nproc); });
  INFO("stdout: " << c.result.out);
  for (auto& [rank, lines] : c.ranks) {
    const auto diffs = differences(lines);
    CHECK(diffs.size() == compared(nproc));
    // Against the unsplit model on the whole batch (the checks compare bit for bit with accumulation).
    for (double d : diffs) CHECK(d <= 1e-6);
  }
}

// A rank's "EXIT t" or "ERROR t type what" line: (t, the rest).
std::optional<std::pair<double, std::string>> event_of(const std::vector<std::string>& lines) {
  const std::regex event(R"((EXIT|ERROR) ([0-9.]+)(.*))");
  std::smatch m;
  for (const auto& l : lines)
    if (std::regex_match(l, m, event)) return std::make_pair(std::stod(m[2]), m[1].str() + m[3].str());
  return std::nullopt;
}

// Runs pipeline_checks <mode> <schedule> on nproc ranks; every rank must report an event
// (stage 1 may exit), all within kBoundS of the first, and ddprun exit 0 (each survivor
// exits 0 only when its step failed). Returns each rank's event text.
std::map<int, std::string> run_failure(int nproc, const std::string& mode, const std::string& schedule) {
  const auto r = run({e2e::kDdprun, "--nproc_per_node=" + std::to_string(nproc), PIPELINE_CHECKS_BIN, mode, schedule},
                     {}, 120s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  std::map<int, std::string> out;
  double first = 1e300, latest = 0;
  for (int rank = 0; rank < nproc; ++rank) {
    const auto e = event_of(ranks[rank]);
    INFO("rank " << rank);
    REQUIRE(e);
    first = std::min(first, e->first);
    latest = std::max(latest, e->first);
    out[rank] = e->second;
    if (e->second.rfind("ERROR", 0) == 0) {
      // Every failure names this rank's stage and a micro-batch.
      CHECK(std::regex_search(e->second, std::regex("pipeline stage " + std::to_string(rank) + " of " +
                                                    std::to_string(nproc) + R"(, micro-batch \d \((forward|backward)\): )")));
      // The pipeline stays broken: the next step threw the same error.
      CHECK(std::find(ranks[rank].begin(), ranks[rank].end(), "AGAIN same") != ranks[rank].end());
    }
  }
  CHECK(latest - first < kBoundS);
  return out;
}

}  // namespace

TEST_CASE("1 stage: the schedules run the micro-batches alone, equal to the unsplit model", "[pipeline]") {
  run_checks(1);
}

TEST_CASE("2 stages: GPipe and 1F1B equal the unsplit model (SGD, AdamW, small batches), step stats", "[pipeline]") {
  run_checks(2);
}

TEST_CASE("4 stages: GPipe and 1F1B equal the unsplit model (SGD, AdamW, small batches), step stats, dp2 x pp2 with DDP", "[pipeline]") {
  run_checks(4);
}

TEST_CASE("4 stages: a stage that exits in micro-batch 2's forward fails every other stage at once",
          "[pipeline]") {
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    INFO(schedule);
    const auto events = run_failure(4, "exit", schedule);
    CHECK(events.at(1) == "EXIT");
    // Its downstream neighbour waits for that micro-batch's activation, or an earlier one: the
    // victim's asynchronous sends of the step may not have gone out before it exited.
    CHECK_THAT(events.at(2), Catch::Matches("ERROR PeerError pipeline stage 2 of 4, micro-batch [0-2] \\(forward\\): .*"));
    for (int rank : {0, 3}) CHECK_THAT(events.at(rank), Catch::StartsWith("ERROR PeerError"));
  }
}

TEST_CASE("stages that cut the batch differently fail with Mismatch naming both counts, no hang",
          "[pipeline]") {
  for (const auto& [nproc, schedule] : std::vector<std::pair<int, std::string>>{{2, "1f1b"}, {4, "gpipe"}}) {
    INFO(nproc << " stages, " << schedule);
    const auto events = run_failure(nproc, "mismatch", schedule);
    // Stage 1 (3 micro-batches) finds it in stage 0's activation header, stage 0 in stage 1's
    // gradient header; stage 2 waits for stage 1's first activation and fails when stage 1 exits.
    CHECK_THAT(events.at(1), Catch::Matches("ERROR Mismatch pipeline stage 1 of \\d, micro-batch 0 \\(forward\\): "
                                            "stage 0 runs train_step #0: 32 rows in up to 4 micro-batches, " + schedule +
                                            "; this stage runs train_step #0: 32 rows in up to 3 micro-batches, " + schedule));
    CHECK_THAT(events.at(0), Catch::Matches("ERROR Mismatch pipeline stage 0 of \\d, micro-batch 0 \\(backward\\): "
                                            "stage 1 runs .* up to 3 micro-batches.*; this stage runs .* up to 4 micro-batches.*"));
    for (int rank = 2; rank < nproc; ++rank) CHECK_THAT(events.at(rank), Catch::StartsWith("ERROR PeerError"));
  }
}

TEST_CASE("4 stages: PipelineOptions::timeout fails the neighbours of a stalled stage with Timeout", "[pipeline]") {
  const auto events = run_failure(4, "stall", "gpipe");
  // Stage 1 sleeps in micro-batch 2's forward: stage 2 waits for that activation, stage 0
  // for the gradient of micro-batch 0.
  CHECK_THAT(events.at(0), Catch::Matches("ERROR Timeout pipeline stage 0 of 4, micro-batch 0 \\(backward\\): .*"));
  CHECK_THAT(events.at(2), Catch::Matches("ERROR Timeout pipeline stage 2 of 4, micro-batch 2 \\(forward\\): .*"));
}
