// The failure summary puts the root cause first with everything needed to find it.
#include <catch2/catch.hpp>
#include <signal.h>

#include "summary.hpp"

TEST_CASE("the summary names the root cause first and then the others", "[summary]") {
  ddprun::LaunchPlan plan;
  plan.run_id = "job42";
  plan.hostname = "node7";
  ddprun::AttemptResult result;
  ddprun::WorkerOutcome ok, failed, stopped;
  ok = {0, 0, 100, true, 0 << 8, {}, false, {}, "", {}};
  failed = {1, 1, 101, true, 3 << 8, {}, false, {"Traceback", "ValueError: bad"}, "/logs/job42/attempt_0/1/stderr.log",
            {}};
  stopped = {2, 2, 102, true, SIGTERM, {}, true, {}, "", {}};
  result.workers = {ok, failed, stopped};
  result.root_cause = 1;

  std::string text = ddprun::format_failure_summary(plan, result, 0);
  INFO(text);
  auto root = text.find("Root cause");
  auto root_line = text.find("rank 1 (local_rank 1) on node7, pid 101: exited with code 3");
  auto others = text.find("Other workers");
  REQUIRE(root != std::string::npos);
  REQUIRE(root_line != std::string::npos);
  REQUIRE(others != std::string::npos);
  CHECK(root < root_line);
  CHECK(root_line < others);
  CHECK_THAT(text, Catch::Contains("job42"));
  CHECK_THAT(text, Catch::Contains("/logs/job42/attempt_0/1/stderr.log"));
  CHECK_THAT(text, Catch::Contains("| ValueError: bad"));
  CHECK_THAT(text, Catch::Contains("rank 2 (local_rank 2) on node7, pid 102: killed by SIGTERM (signal 15)"));
  CHECK_THAT(text, Catch::Contains("(stopped by ddprun)"));
  CHECK(result.exit_status() == 3);
}

TEST_CASE("a stop by signal is reported as such and exits 128+signal", "[summary]") {
  ddprun::LaunchPlan plan;
  plan.run_id = "run-b";
  plan.hostname = "host-b";
  ddprun::AttemptResult result;
  result.stop_signal = SIGINT;
  result.workers = {{0, 0, 5, true, SIGINT, {}, true, {}, "", {}}};
  std::string text = ddprun::format_failure_summary(plan, result, 2);
  CHECK_THAT(text, Catch::Contains("stopped by SIGINT (signal 2) sent to ddprun"));
  CHECK_THAT(text, Catch::Contains("attempt 2"));
  CHECK(result.exit_status() == 130);
}

TEST_CASE("a log that could not be written to the end is named in the summary", "[summary]") {
  ddprun::LaunchPlan plan;
  plan.run_id = "job9";
  plan.hostname = "node3";
  ddprun::AttemptResult result;
  ddprun::WorkerOutcome root{0, 0, 7, true, 1 << 8, {}, false, {}, "/l/0/stderr.log", {}};
  ddprun::WorkerOutcome other{1, 1, 8, true, 0, {}, false, {}, "/l/1/stderr.log", {}};
  root.incomplete_logs = {{"/l/0/stderr.log", "No space left on device"}};
  other.incomplete_logs = {{"/l/1/stdout.log", "Input/output error"}};
  result.workers = {root, other};
  CHECK(ddprun::format_incomplete_logs(result) ==
        "2 worker log file(s) are incomplete, the rest of their output went to the console: "
        "/l/0/stderr.log (No space left on device), /l/1/stdout.log (Input/output error)");
  result.root_cause = 0;
  std::string text = ddprun::format_failure_summary(plan, result, 0);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("    log incomplete: /l/0/stderr.log (No space left on device); the rest went to the "
                                   "console"));
  CHECK_THAT(text, Catch::Contains("    log incomplete: /l/1/stdout.log (Input/output error)"));
  result.workers[0].incomplete_logs.clear();
  result.workers[1].incomplete_logs.clear();
  CHECK(ddprun::format_incomplete_logs(result).empty());
}
