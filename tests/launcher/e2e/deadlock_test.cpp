// Send/recv deadlocks on one host, end to end: the real ddprun with collective_worker
// in its "deadlock" mode (after one all_reduce ranks 0 and 1 recv from each other, a
// third rank waits in a barrier). The stall report names the recv calls, their peers
// and the cycle (within --stall_timeout + 10 s here; the figure is the bench's);
// --stall_action=stop exits 124; `ddprun status` shows the recv each rank waits in.
#include <catch2/catch.hpp>
#include <signal.h>

#include <thread>

#include "e2e.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kCollectiveWorker = COLLECTIVE_WORKER_BIN;
constexpr double kStallTimeout = 3;
const std::string kCycle = "rank 0 waits in recv #1 from rank 1, which waits in recv #1 from rank 0: a deadlock";

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Seconds from every rank saying it deadlocked to ddprun naming the deadlock (at
// detection) and to the full report (once the workers' stacks are read).
struct Delays {
  double named = 0;
  double reported = 0;
};
Delays report_delays(const Process& p, int ranks) {
  REQUIRE(p.wait_for_stdout([&](const std::string& o) { return count_of(o, "deadlocked at") == size_t(ranks); }, 60s));
  const double onset = p.seconds_since_start();
  Delays d;
  const auto end = std::chrono::steady_clock::now() + 40s;
  while (std::chrono::steady_clock::now() < end && !contains(p.err(), "stopping the job")) {
    if (d.named == 0 && contains(p.err(), kCycle + "; the report follows")) d.named = p.seconds_since_start() - onset;
    std::this_thread::sleep_for(20ms);
  }
  INFO(p.err());
  REQUIRE(contains(p.err(), "stopping the job"));
  d.reported = p.seconds_since_start() - onset;
  if (d.named == 0) d.named = d.reported;
  return d;
}

// The bounds: the deadlock named within --stall_timeout + 10 s, the full report after
// at most the stacks' own timeout (10 s) more. Loose on purpose (a loaded machine must
// not fail them): the target figure is measured by scripts/bench/deadlock.
void check_delays(const Delays& d, int ranks) {
  std::printf("deadlock named %.2f s, full report %.2f s after it formed (--stall_timeout=%g, %d ranks)\n", d.named,
              d.reported, kStallTimeout, ranks);
  CHECK(d.named <= kStallTimeout + 10);
  CHECK(d.reported <= kStallTimeout + 10 + 10);
}

std::string root_cause(const std::string& err) {
  const auto at = err.find("Root cause (ddprun stopped a stalled job, --stall_action=stop):");
  REQUIRE(at != std::string::npos);
  return err.substr(at);
}

ProcessOptions runtime_env(const TempDir& dir) {
  ProcessOptions o;
  o.set_env["XDG_RUNTIME_DIR"] = dir.path().string();
  return o;
}

std::vector<std::string> deadlock_job(int ranks, const std::string& action, double stall_timeout) {
  char timeout[32];
  std::snprintf(timeout, sizeof(timeout), "--stall_timeout=%g", stall_timeout);
  return e2e::ddprun({"--nproc_per_node=" + std::to_string(ranks), "--standalone", timeout,
                      "--stall_action=" + action, "--grace_period=2", kCollectiveWorker, "deadlock"});
}

// Runs the deadlock of `ranks` ranks with --stall_action=stop: the deadlock named in
// time, exit 124, and the root cause; returns the root cause's part of the output.
std::string stopped_deadlock(int ranks) {
  TempDir runtime;
  Process p(deadlock_job(ranks, "stop", kStallTimeout), runtime_env(runtime));
  check_delays(report_delays(p, ranks), ranks);
  auto status = p.wait(30s);
  INFO(p.err());
  REQUIRE(status.has_value());
  CHECK(*status == 124);
  CHECK(contains(p.err(), "stalled: " + kCycle));
  std::string rest = root_cause(p.err());
  CHECK(contains(rest, "\n  " + kCycle + "\nCalls:\n"));
  CHECK(contains(rest, "wait-for cycle: " + kCycle));
  CHECK(contains(rest, "rank 0 waits in recv #1 from rank 1 (recv 4×f32 from 1, "));
  CHECK(contains(rest, "rank 1 waits in recv #1 from rank 0 (recv 4×f32 from 0, "));
  return rest;
}

}  // namespace

TEST_CASE("two ranks that recv from each other get a deadlock report and stall action stop exits 124",
          "[e2e][stall][deadlock]") {
  const std::string rest = stopped_deadlock(2);
  CHECK(!contains(rest, "barrier #"));
}

TEST_CASE("a deadlock of two ranks with a third in barrier names the recvs and the cycle and what the barrier waits for",
          "[e2e][stall][deadlock]") {
  const std::string rest = stopped_deadlock(3);
  CHECK(contains(rest, "rank 2 waits in barrier #2 of group 0 (barrier, "));
  CHECK(contains(rest, "rank 2 waits in barrier #2 of group 0 for ranks 0,1: rank 0 is blocked in recv #1 from rank 1; "
                       "rank 1 is blocked in recv #1 from rank 0"));
}

TEST_CASE("ddprun status shows the recv each deadlocked rank waits in and for how long", "[e2e][status][deadlock]") {
  TempDir runtime;
  Process p(deadlock_job(3, "report", 120), runtime_env(runtime));
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return count_of(o, "deadlocked at") == 3; }, 60s));
  RunResult r;
  for (int i = 0; i < 100; ++i) {
    r = run(e2e::ddprun({"status"}), runtime_env(runtime), 10s);
    if (r.status == 0 && contains(r.out, "recv #1 from rank 0 (waiting ") && contains(r.out, "barrier #2")) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(r.out << r.err << p.err());
  REQUIRE(r.status == 0);
  const auto lines = lines_of(r.out);
  auto line_of = [&](int rank) {
    for (const auto& l : lines) {
      if (l.rfind(std::to_string(rank) + " ", 0) == 0) return l;
    }
    return std::string();
  };
  CHECK(contains(line_of(0), "recv #1 from rank 1 (waiting "));
  CHECK(contains(line_of(1), "recv #1 from rank 0 (waiting "));
  CHECK(contains(line_of(2), "barrier #2 of group 0 (waiting "));
  auto json = run(e2e::ddprun({"status", "--json"}), runtime_env(runtime), 10s);
  CHECK(contains(json.out, "\"call\":\"recv #1 from rank 1\",\"op\":\"recv 4×f32 from 1\",\"call_state\":"));
  CHECK(contains(json.out, "\"waiting_s\":"));
  p.send_signal(SIGTERM);
  REQUIRE(p.wait(30s).has_value());
}
