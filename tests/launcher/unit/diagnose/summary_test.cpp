// The failure summary puts the root cause first with everything needed to find it.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>

#include "job/failure_notice.hpp"
#include "diagnose/summary.hpp"

TEST_CASE("the summary names the root cause first and then the others", "[summary]") {
  ddprun::LaunchPlan plan;
  plan.run_id = "job42";
  plan.hostname = "node7";
  ddprun::AttemptResult result;
  ddprun::WorkerOutcome ok, failed, stopped;
  ok = {0, 0, 100, true, 0 << 8, {}, false, {}, "", {}, ""};
  failed = {1, 1, 101, true, 3 << 8, {}, false, {"Traceback", "ValueError: bad"}, "/logs/job42/attempt_0/1/stderr.log",
            {}, ""};
  stopped = {2, 2, 102, true, SIGTERM, {}, true, {}, "", {}, ""};
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
  result.workers = {{0, 0, 5, true, SIGINT, {}, true, {}, "", {}, ""}};
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
  ddprun::WorkerOutcome root{0, 0, 7, true, 1 << 8, {}, false, {}, "/l/0/stderr.log", {}, ""};
  ddprun::WorkerOutcome other{1, 1, 8, true, 0, {}, false, {}, "/l/1/stderr.log", {}, ""};
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

TEST_CASE("another node's failure record is printed as escaped text, never raw bytes", "[summary]") {
  using ddprun::printable_text;
  CHECK(printable_text("exited with code 3") == "exited with code 3");
  CHECK(printable_text("caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80");
  CHECK(printable_text(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(printable_text("\x1b[2J\r\t\x7f") == "\\x1b[2J\\x0d\\x09\\x7f");
  CHECK(printable_text("\xc2\x9b" "31m") == "\\xc2\\x9b31m");                  // C1 CSI as UTF-8
  CHECK(printable_text("\xff\xfe") == "\\xff\\xfe");                            // never UTF-8
  CHECK(printable_text("\xc3") == "\\xc3");                                     // cut short
  CHECK(printable_text("\xc0\xaf \xe0\x80\xaf") == "\\xc0\\xaf \\xe0\\x80\\xaf");  // overlong '/'
  CHECK(printable_text("\xed\xa0\x80") == "\\xed\\xa0\\x80");                   // a surrogate
  CHECK(printable_text("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");          // past U+10FFFF

  // A hostile job's record as it arrives from the store, through to the summary.
  auto notice = ddprun::FailureNotice::decode("1\n-1\n1\nlost\nevil\x1b]0;pwned\x07\nrm -rf \x1b[8m\xff\xc3");
  ddprun::LaunchPlan plan;
  plan.run_id = "victim";
  plan.hostname = "node0";
  ddprun::AttemptResult result;
  result.remote = ddprun::RemoteCause{notice.describe(), notice.status, notice.kind, {}};
  std::string text = ddprun::format_failure_summary(plan, result, 0);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("node 1 (evil\\x1b]0;pwned\\x07): rm -rf \\x1b[8m\\xff\\xc3"));
  CHECK(std::all_of(text.begin(), text.end(), [](unsigned char c) { return c == '\n' || (c >= 0x20 && c < 0x7f); }));

  auto garbage = ddprun::FailureNotice::decode("\x1b[31mnot\na notice");
  CHECK(garbage.what == "an unreadable failure notice: \\x1b[31mnot\\x0aa notice");
}
