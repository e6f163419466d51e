// Progress records under the real ddprun: every rank's worker runtime publishes what
// its process groups are doing, and another rank reads it from the job's store as
// ddprun does (progress_worker.cpp makes the calls and checks the record).
#include <catch2/catch.hpp>

#include "e2e.hpp"
#include "subprocess.hpp"

using namespace testing;

namespace {

RunResult run_progress_worker(const std::map<std::string, std::string>& env = {}) {
  ProcessOptions o;
  o.set_env = env;
  auto r = run(e2e::ddprun({"--nproc_per_node=2", PROGRESS_WORKER_BIN}), o, 120s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 0);
  CHECK(r.out.find("FAILED") == std::string::npos);
  return r;
}

}  // namespace

TEST_CASE("progress: a rank reads another rank's record (groups and calls and steps) and a failure at once", "[progress]") {
  auto r = run_progress_worker();
  const auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks.contains(0));
  int passed = 0;
  for (const auto& line : ranks.at(0)) passed += line.rfind("progress: ok:", 0) == 0 ? 1 : 0;
  INFO("stdout: " << r.out);
  CHECK(passed == 14);  // every check of progress_worker.cpp, rank 0
}

TEST_CASE("progress: DDP_FLIGHT_RECORDER=0 still publishes the rank, without groups", "[progress]") {
  auto r = run_progress_worker({{"DDP_FLIGHT_RECORDER", "0"}});
  const auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks.contains(0));
  int passed = 0;
  for (const auto& line : ranks.at(0)) passed += line.rfind("progress: ok:", 0) == 0 ? 1 : 0;
  INFO("stdout: " << r.out);
  CHECK(passed == 7);
}
