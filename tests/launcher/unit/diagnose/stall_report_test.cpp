// The stall report's cross-rank analysis (a pure function of the progress records),
// and its process-level part with a stand-in debugger.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "diagnose/stall_report.hpp"
#include "subprocess.hpp"

using ddp::contract::GroupProgress;
using ddp::contract::OpSummary;
using ddp::contract::ProgressRecord;
using ddprun::ProgressRecords;

namespace {

constexpr int64_t kT0 = 1'800'000'000'000;

// Rank `rank` of a world of `size` in group "0": completed `done` all_reduces, and
// waits in the next one (state `state`) unless `state` is empty.
ProgressRecord rank_at(int rank, int size, uint64_t done, const std::string& state) {
  ProgressRecord r;
  r.rank = rank;
  r.pid = 100 + rank;
  r.host = "h";
  GroupProgress g;
  g.group = "0";
  g.rank = rank;
  g.size = size;
  g.issued = g.completed = done;
  if (done > 0) g.current = g.last_completed = OpSummary{done, "all_reduce 8×f32 sum", "completed", kT0 + 10};
  if (!state.empty()) {
    g.issued = done + 1;
    g.current = OpSummary{done + 1, "all_reduce 8×f32 sum", state, kT0 + 20};
  }
  r.groups.push_back(g);
  return r;
}

}  // namespace

TEST_CASE("stopped workers are named as the likely cause with the call the others wait in", "[stall]") {
  ProgressRecords recs = {rank_at(0, 3, 4, "started"), rank_at(1, 3, 4, ""), rank_at(2, 3, 4, "started")};
  CHECK(ddprun::stopped_headline(recs, {{{1, 4242}, false}}) ==
        "rank 1 (pid 4242) is stopped (SIGSTOP): the others wait for it in all_reduce #5 of group 0");
  CHECK(ddprun::stopped_headline(recs, {{{1, 7}, true}, {{2, 8}, false}}) ==
        "ranks 1 (pid 7), 2 (pid 8) are stopped (SIGSTOP or a tracer): the others wait for them in all_reduce #5 of "
        "group 0");
  // Nobody else waits: the stopped rank itself is all there is to say.
  ProgressRecords alone = {rank_at(0, 2, 4, ""), rank_at(1, 2, 4, "started")};
  CHECK(ddprun::stopped_headline(alone, {{{1, 9}, true}}) == "rank 1 (pid 9) is stopped by a tracer: the job waits for it");
}

TEST_CASE("the analysis names the rank that never arrived and the ones that wait", "[stall]") {
  ProgressRecords recs = {rank_at(0, 3, 4, "started"), rank_at(1, 3, 4, ""), rank_at(2, 3, 4, "started")};
  CHECK(ddprun::any_rank_waiting(recs));
  CHECK_FALSE(ddprun::any_call_failed(recs));
  CHECK(ddprun::progress_signature(recs) == 12);
  CHECK(ddprun::last_completion_ms(recs) == kT0 + 10);
  auto a = ddprun::analyse_stall(recs, kT0 + 30'020);
  CHECK(a.headline == "rank 1 never arrived at all_reduce #5 of group 0, which ranks 0,2 wait in");
  CHECK(a.stalled == std::vector<int>{1});
  CHECK_THAT(a.text, Catch::Contains("rank 0 waits in all_reduce #5 of group 0 (all_reduce 8×f32 sum, started)") &&
                         Catch::Contains(", 30.0 s\n") &&
                         Catch::Contains("rank 1 never arrived; last completed all_reduce #4 of group 0"));
}

TEST_CASE("ranks without a record are named and a failed call is seen", "[stall]") {
  ProgressRecords recs = {rank_at(0, 2, 0, "failed"), std::nullopt};
  CHECK(ddprun::any_call_failed(recs));
  auto a = ddprun::analyse_stall(recs, kT0 + 1000);
  CHECK(a.headline == "rank 1 never arrived at all_reduce #1 of group 0, which rank 0 waits in");
  CHECK_THAT(a.text, Catch::Contains("1 member(s) published no progress record (ranks 1)") &&
                         Catch::Contains("failed) since"));
}

TEST_CASE("with every rank arrived the waiting ranks are the stalled ones, and no record at all says so", "[stall]") {
  ProgressRecords recs = {rank_at(0, 2, 2, "started"), rank_at(1, 2, 2, "started")};
  auto a = ddprun::analyse_stall(recs, kT0);
  CHECK(a.headline == "ranks 0,1 wait in all_reduce #3 of group 0 and it does not complete");
  CHECK(a.stalled == std::vector<int>{0, 1});
  auto none = ddprun::analyse_stall(ProgressRecords(2), kT0);
  CHECK_THAT(none.text, Catch::Contains("no rank published a progress record"));
  CHECK_FALSE(ddprun::any_rank_waiting(ProgressRecords(2)));
}

TEST_CASE("ranks waiting in different calls at the same position: the headline says mismatched calls", "[stall]") {
  ProgressRecords recs = {rank_at(0, 3, 1, "started"), rank_at(1, 3, 1, "started"), rank_at(2, 3, 1, "started")};
  recs[1]->groups[0].current = OpSummary{2, "scatter 256×f32 root 0", "started", kT0 + 20};
  auto a = ddprun::analyse_stall(recs, kT0 + 1000);
  CHECK(a.headline == "mismatched calls at #2 of group 0: ranks 0,2 wait in all_reduce (all_reduce 8×f32 sum), "
                      "rank 1 in scatter (scatter 256×f32 root 0)");
  CHECK(a.stalled == std::vector<int>{0, 1, 2});
  CHECK_THAT(a.text, Catch::Contains("rank 1 waits in scatter #2 of group 0 (scatter 256×f32 root 0, started)"));
  // The same kind with another count is a mismatch too; a scatter's root and the others
  // name different counts for one matching call, which is not.
  recs[1]->groups[0].current = OpSummary{2, "all_reduce 4×f32 sum", "started", kT0 + 20};
  CHECK_THAT(ddprun::analyse_stall(recs, kT0 + 1000).headline, Catch::StartsWith("mismatched calls at #2 of group 0"));
  for (size_t r = 0; r < 3; ++r) {
    recs[r]->groups[0].current = OpSummary{2, r == 0 ? "scatter 768×f32 root 0" : "scatter 256×f32 root 0", "started",
                                           kT0 + 20};
  }
  CHECK(ddprun::analyse_stall(recs, kT0 + 1000).headline ==
        "ranks 0,1,2 wait in scatter #2 of group 0 and it does not complete");
}

TEST_CASE("ranks disagreeing on a scatter's root or dtype, or a gather's count, are a mismatch", "[stall]") {
  // Two ranks at #2: rank 0 in `a`, rank 1 in `b`; the headline the analysis gives.
  auto headline = [](const std::string& a, const std::string& b) {
    ProgressRecords recs = {rank_at(0, 2, 1, "started"), rank_at(1, 2, 1, "started")};
    recs[0]->groups[0].current = OpSummary{2, a, "started", kT0 + 20};
    recs[1]->groups[0].current = OpSummary{2, b, "started", kT0 + 20};
    return ddprun::analyse_stall(recs, kT0 + 1000).headline;
  };
  CHECK(headline("scatter 256×f32 root 0", "scatter 256×f32 root 1") ==
        "mismatched calls at #2 of group 0: rank 0 waits in scatter (scatter 256×f32 root 0), "
        "rank 1 in scatter (scatter 256×f32 root 1)");
  CHECK_THAT(headline("scatter 256×f32 root 0", "scatter 256×f16 root 0"), Catch::StartsWith("mismatched calls"));
  CHECK(headline("gather 256×f32 root 0", "gather 128×f32 root 0") ==
        "mismatched calls at #2 of group 0: rank 0 waits in gather (gather 256×f32 root 0), "
        "rank 1 in gather (gather 128×f32 root 0)");
  CHECK_THAT(headline("gather 256×f32 root 0", "gather 256×f32 root 1"), Catch::StartsWith("mismatched calls"));
  // The root's whole input against another rank's part is the one legitimate difference.
  CHECK(headline("scatter 512×f32 root 0", "scatter 256×f32 root 0") ==
        "ranks 0,1 wait in scatter #2 of group 0 and it does not complete");
  CHECK(headline("gather 256×f32 root 0", "gather 256×f32 root 0") ==
        "ranks 0,1 wait in gather #2 of group 0 and it does not complete");
}

// ---------------------------------------------------------------------------
// The process-level part with a stand-in debugger: a script named gdb, first on PATH.
// ---------------------------------------------------------------------------

namespace {

// Puts `dir` first on PATH for the life of the object.
class PathFirst {
 public:
  explicit PathFirst(const std::filesystem::path& dir) : old_(std::getenv("PATH") ? std::getenv("PATH") : "") {
    setenv("PATH", (dir.string() + ":" + old_).c_str(), 1);
  }
  ~PathFirst() { setenv("PATH", old_.c_str(), 1); }

 private:
  std::string old_;
};

// A child that sleeps (the "worker" of these tests), killed and reaped at the end.
struct SleepingChild {
  pid_t pid = -1;
  SleepingChild() {
    pid = fork();
    if (pid == 0) {
      execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~SleepingChild() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

char state_letter(pid_t pid) {
  std::string s = ddprun::process_state(pid);
  return s.empty() ? '?' : s[0];
}

}  // namespace

TEST_CASE("a debugger that runs out of time is stopped and the worker it stopped goes on", "[stall]") {
  testing::TempDir dir;
  // Stops the worker as a ptrace attach does, ignores SIGTERM, and never ends by itself.
  testing::write_file(dir.path() / "gdb",
                      "#!/bin/sh\necho $$ > " + (dir.path() / "debugger.pid").string() +
                          "\nkill -STOP \"$2\"\ntrap '' TERM\nexec sleep 60\n",
                      true);
  PathFirst path(dir.path());
  SleepingChild worker;
  REQUIRE(worker.pid > 0);
  ddprun::ProcessReportOptions options;
  options.stack_timeout = std::chrono::milliseconds(1000);
  auto start = std::chrono::steady_clock::now();
  std::string text = ddprun::describe_processes("h", {{0, worker.pid}}, options);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(text);
  CHECK_THAT(text, Catch::Contains("gave up after 1.0 s"));
  CHECK(took < 8);  // 1 s, then 1 s to detach, 1 s after the kill; margin for a loaded machine
  // The worker is continued, not left stopped.
  for (int i = 0; i < 100 && state_letter(worker.pid) == 'T'; ++i) usleep(20'000);
  const char state = state_letter(worker.pid);
  CHECK((state == 'S' || state == 'R'));  // running or sleeping again, not stopped (T)
  // The debugger itself is gone (killed: it ignored SIGTERM), and reaped.
  auto pid_text = testing::read_file(dir.path() / "debugger.pid");
  pid_t debugger = static_cast<pid_t>(std::atoi(pid_text.c_str()));
  REQUIRE(debugger > 0);
  // Gone: killed and reaped (by the report, or a moment later by whoever reaps).
  for (int i = 0; i < 150 && !ddprun::process_state(debugger).empty(); ++i) usleep(20'000);
  INFO("the debugger's state: " << ddprun::process_state(debugger));
  CHECK(ddprun::process_state(debugger).empty());
}

TEST_CASE("the stacks come through while another thread reaps every child, as ddprun's supervisor does", "[stall]") {
  testing::TempDir dir;
  testing::write_file(dir.path() / "gdb", "#!/bin/sh\necho 'Thread 1 (LWP 1):'\necho '#0  fake_frame ()'\n", true);
  PathFirst path(dir.path());
  SleepingChild worker;
  REQUIRE(worker.pid > 0);
  // Reaps whatever child ends (the debugger, here) while the report waits for it.
  std::atomic<bool> done{false};
  std::atomic<int> reaped_worker{0};
  std::thread reaper([&] {
    while (!done) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid == worker.pid) reaped_worker = 1;
      if (pid <= 0) usleep(1000);
    }
  });
  ddprun::ProcessReportOptions options;
  options.stack_timeout = std::chrono::milliseconds(5000);
  auto start = std::chrono::steady_clock::now();
  std::string texts;
  for (int i = 0; i < 5; ++i) texts += ddprun::describe_processes("h", {{0, worker.pid}}, options);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  done = true;
  reaper.join();
  INFO(texts);
  CHECK(took < 10);  // nothing waits for an exit status the reaper took
  CHECK(Catch::Contains("fake_frame").match(texts));
  CHECK(texts.find("gave up") == std::string::npos);
  CHECK(reaped_worker == 0);
  CHECK(state_letter(worker.pid) == 'S');
}

TEST_CASE("a worker that exits before gdb reads its stacks is said to have exited, on one line", "[stall]") {
  testing::TempDir dir;
  // The worker ends while the debugger attaches, as gdb then reports it.
  testing::write_file(dir.path() / "gdb",
                      "#!/bin/sh\nkill -KILL \"$2\"\nsleep 0.3\necho 'ptrace: No such process.'\n", true);
  PathFirst path(dir.path());
  SleepingChild worker;
  REQUIRE(worker.pid > 0);
  ddprun::ProcessReportOptions options;
  options.stack_timeout = std::chrono::milliseconds(5000);
  const std::string text = ddprun::describe_processes("h", {{0, worker.pid}}, options);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("    no stacks: the worker exited before gdb read them (ptrace: No such process.)\n"));
  CHECK(text.find("ptrace rights") == std::string::npos);
}
