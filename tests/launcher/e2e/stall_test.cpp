// Stall reports and `ddprun status`, end to end: the real ddprun with real workers.
// test_worker's "progress" modes publish ProgressRecords through the contract as the
// worker runtime does; the [recorder] cases use the worker runtime itself
// (collective_worker), so they pass once the runtime publishes its records.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "ddp/contract/store_keys.hpp"
#include "e2e.hpp"
#include "rdzv/tcp_store.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kCollectiveWorker = COLLECTIVE_WORKER_BIN;
const std::string kRendezvousBin = RENDEZVOUS_BIN;

// Polls `ready` on a process's stderr; returns the seconds since its start when it held.
std::optional<double> wait_for_stderr(const Process& p, const std::function<bool(const std::string&)>& ready,
                                      std::chrono::milliseconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (ready(p.err())) return p.seconds_since_start();
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// Every rank printed "progress: completed N": the stall's onset, in seconds since start.
double onset_of(const Process& p, int ranks) {
  double at = -1;
  bool ok = p.wait_for_stdout([&](const std::string& out) { return count_of(out, "progress: completed") >= size_t(ranks); },
                              30s);
  REQUIRE(ok);
  at = p.seconds_since_start();
  return at;
}

// An environment whose runtime files go to a folder of this test.
ProcessOptions runtime_env(const TempDir& dir) {
  ProcessOptions o;
  o.set_env["XDG_RUNTIME_DIR"] = dir.path().string();
  return o;
}

// Once per episode: the job goes on and nothing is printed again while it stays
// stuck; then the job is ended.
void expect_once_per_episode(Process& p) {
  std::this_thread::sleep_for(4s);
  CHECK(!p.wait(0ms).has_value());
  CHECK(count_of(p.err(), "stall report for job") == 1);
  p.send_signal(SIGTERM);
  REQUIRE(p.wait(30s).has_value());
}

// A rendezvous daemon on loopback whose token is "status-secret", once it listens.
std::unique_ptr<Process> start_daemon(const TempDir& dir, int port) {
  write_file(dir / "token", "status-secret\n");
  auto daemon = std::make_unique<Process>(std::vector<std::string>{
      kRendezvousBin, "--host=127.0.0.1", "--port=" + std::to_string(port), "--token-file", (dir / "token").string()});
  REQUIRE(daemon->wait_for_stdout([](const std::string& o) { return contains(o, "listening"); }, 10s));
  return daemon;
}

// For `ddprun status` with the daemon's token and no runtime files: only the daemon can answer.
ProcessOptions daemon_only_env(const TempDir& dir) {
  ProcessOptions env;
  env.set_env["DDPRUN_TOKEN"] = "status-secret";
  env.set_env["XDG_RUNTIME_DIR"] = (dir / "none").string();
  return env;
}

// A daemon on a free loopback port, and what the job it serves and `ddprun status` need.
struct DaemonJob {
  TempDir dir;
  int port = e2e::free_port();
  std::unique_ptr<Process> daemon = start_daemon(dir, port);
  std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(port);
  ProcessOptions env() const {
    ProcessOptions o = runtime_env(dir);
    o.set_env["DDPRUN_TOKEN"] = "status-secret";
    return o;
  }
  // `ddprun status --json` of job `id` through the daemon, until it shows `calls` calls (or 15 s).
  RunResult status_showing(const std::string& id, size_t calls) const {
    RunResult r;
    for (int i = 0; i < 150; ++i) {
      r = run(e2e::ddprun({"status", endpoint, "--rdzv_id=" + id, "--json"}), daemon_only_env(dir), 10s);
      if (r.status == 0 && count_of(r.out, "all_reduce #") == calls) break;
      std::this_thread::sleep_for(100ms);
    }
    return r;
  }
};

// Nothing about a stall for `quiet`; then the job is ended.
void expect_no_stall_report(Process& p, std::chrono::milliseconds quiet) {
  std::this_thread::sleep_for(quiet);
  INFO(p.err());
  CHECK(!contains(p.err(), "stall"));
  p.send_signal(SIGTERM);
  REQUIRE(p.wait(30s).has_value());
}

// An environment (runtime files in `dir`) with `dir` first on PATH, holding an
// executable `name` that runs `script`: a stand-in for a program of that name.
ProcessOptions with_stand_in(const TempDir& dir, const std::string& name, const std::string& script) {
  write_file(dir / name, script, true);
  ProcessOptions env = runtime_env(dir);
  env.set_env["PATH"] = dir.path().string() + ":/usr/bin:/bin";
  return env;
}

// The pid of the worker of rank `rank` among `parent`'s children (by RANK in its
// environment), or -1.
pid_t worker_pid(pid_t parent, int rank) {
  const std::string want = std::string("RANK=") + std::to_string(rank);
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(parent) + "/task", ec)) {
    std::ifstream children(task.path() / "children");
    for (pid_t child; children >> child;) {
      std::ifstream environ("/proc/" + std::to_string(child) + "/environ");
      for (std::string var; std::getline(environ, var, '\0');) {
        if (var == want) return child;
      }
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("a rank that sleeps in its compute loop gets one stall report naming it and the job goes on",
          "[e2e][stall]") {
  TempDir runtime;
  Process p(e2e::ddprun({"--nproc_per_node=3", "--standalone", "--stall_timeout=2", "--grace_period=2", e2e::kWorker,
                         "progress", "stall", "1", "5"}),
            runtime_env(runtime));
  double onset = onset_of(p, 3);
  auto reported = wait_for_stderr(p, [](const std::string& e) { return contains(e, "The job goes on"); }, 30s);
  INFO(p.err());
  REQUIRE(reported);
  std::printf("stall report %.2f s after the stall began (--stall_timeout=2)\n", *reported - onset);
  CHECK(*reported - onset < 2 + 5);  // target: timeout + 2 s; margin for a loaded machine
  const std::string err = p.err();
  CHECK(contains(err, "rank 1 never arrived at all_reduce #6 of group 0, which ranks 0,2 wait in"));
  CHECK(contains(err, "rank 0 waits in all_reduce #6 of group 0 (all_reduce 1024×f32 sum, started) since"));
  CHECK(contains(err, "rank 1 never arrived; last completed all_reduce #5 of group 0"));
  CHECK(contains(err, "Worker processes:"));
  for (int r = 0; r < 3; ++r) CHECK(contains(err, "rank " + std::to_string(r) + " on "));
  CHECK(count_of(err, ": alive, state ") == 3);
  CHECK(count_of(err, "native stacks (gdb):") == 3);
  CHECK(contains(err, "Thread 1"));
  CHECK(contains(err, "mode_progress"));  // the frame rank 1 sleeps in
  // While the stall lasts, `ddprun status` calls the ranks stalled.
  auto status = run(e2e::ddprun({"status"}), runtime_env(runtime), 10s);
  INFO(status.out << status.err);
  CHECK(count_of(status.out, " stalled ") == 3);
  expect_once_per_episode(p);
}

TEST_CASE("stall action stop ends the job with the stall report as root cause", "[e2e][stall]") {
  TempDir runtime;
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--stall_timeout=2", "--stall_action=stop",
                         "--grace_period=2", e2e::kWorker, "progress", "stall", "0", "3"}),
            runtime_env(runtime));
  auto status = p.wait(60s);
  INFO(p.err());
  REQUIRE(status.has_value());
  CHECK(*status == 124);
  const std::string err = p.err();
  auto root = err.find("Root cause (ddprun stopped a stalled job, --stall_action=stop):");
  REQUIRE(root != std::string::npos);
  std::string rest = err.substr(root);
  CHECK(contains(rest, "rank 0 never arrived at all_reduce #4 of group 0, which rank 1 waits in"));
  CHECK(contains(rest, "rank 1 waits in all_reduce #4 of group 0"));
  CHECK(contains(rest, "native stacks (gdb):"));
  CHECK(contains(rest, "every node exits with status 124"));
  CHECK(count_of(err, "stall report for job") == 1);
}

TEST_CASE("a failed call gets a report at once while the other ranks still live", "[e2e][stall]") {
  TempDir runtime;
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--grace_period=2", e2e::kWorker, "progress", "fail",
                         "1", "5"}),
            runtime_env(runtime));
  double onset = onset_of(p, 2);
  auto reported = wait_for_stderr(p, [](const std::string& e) { return contains(e, "The job goes on"); }, 30s);
  INFO(p.err());
  REQUIRE(reported);
  CHECK(*reported - onset < 5);  // the default --stall_timeout is 300 s: this is the failed state
  CHECK(contains(p.err(), "a call failed"));
  CHECK(contains(p.err(), "rank 0 waits in all_reduce #6 of group 0 (all_reduce 1024×f32 sum, failed)"));
  CHECK(contains(p.err(), "rank 1 never arrived"));
  p.send_signal(SIGTERM);
  REQUIRE(p.wait(30s).has_value());
}

TEST_CASE("a worker that never uses the runtime still gets the process-level part", "[e2e][stall]") {
  TempDir runtime;
  // Rank 1 is a plain program (no progress record); rank 0 waits in all_reduce #3.
  std::string script = "if [ \"$RANK\" = 1 ]; then exec sleep 600; else exec " + e2e::kWorker + " progress stall 1 2; fi";
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--stall_timeout=2", "--grace_period=2", "/bin/sh",
                         "-c", script}),
            runtime_env(runtime));
  auto reported = wait_for_stderr(p, [](const std::string& e) { return contains(e, "The job goes on"); }, 40s);
  INFO(p.err());
  REQUIRE(reported);
  const std::string err = p.err();
  CHECK(contains(err, "rank 1 never arrived at all_reduce #3 of group 0"));
  CHECK(contains(err, "1 member(s) published no progress record (ranks 1)"));
  auto at = err.find("  rank 1 on ");
  REQUIRE(at != std::string::npos);
  std::string part = err.substr(at, err.find("The job goes on") - at);
  CHECK(contains(part, "alive, state S (sleeping), wchan "));
  CHECK(contains(part, "native stacks (gdb):"));
  CHECK((contains(part, "nanosleep") || contains(part, "sleep")));
  p.send_signal(SIGTERM);
  REQUIRE(p.wait(30s).has_value());
}

TEST_CASE("ddprun status shows a running local job as a table and as JSON and its runtime file goes at exit",
          "[e2e][status]") {
  TempDir runtime;
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--rdzv_id=statusjob", e2e::kWorker, "progress",
                         "steady"}),
            runtime_env(runtime));
  std::filesystem::path dir = runtime / "ddprun";
  // Until the first records are in: ranks show "running" with a call.
  RunResult r;
  for (int i = 0; i < 100; ++i) {
    r = run(e2e::ddprun({"status"}), runtime_env(runtime), 10s);
    if (r.status == 0 && count_of(r.out, "all_reduce #") == 2) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(r.out << r.err << p.err());
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "job statusjob, attempt 0, 2 rank(s)"));
  CHECK(contains(r.out, "RANK"));
  CHECK(count_of(r.out, "running") == 2);
  CHECK(count_of(r.out, " MiB") == 2);
  struct stat st {};
  REQUIRE(stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  int files = 0;
  for (auto& f : std::filesystem::directory_iterator(dir)) {
    REQUIRE(stat(f.path().c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    ++files;
  }
  CHECK(files == 1);

  // --json, parsed by a real JSON parser.
  auto json = run(e2e::ddprun({"status", "--json"}), runtime_env(runtime), 10s);
  REQUIRE(json.status == 0);
  write_file(runtime / "status.json", json.out);
  auto parsed = run({"/usr/bin/python3", "-c",
                     "import json,sys; d=json.load(open(sys.argv[1])); "
                     "print(d['run_id'], d['world_size'], ' '.join(r['state']+':'+str(r['call'])+':'+str(r['pid']>0)+"
                     "':'+str(r['rss_kb']>0) for r in d['ranks']))",
                     (runtime / "status.json").string()});
  INFO(json.out);
  REQUIRE(parsed.status == 0);
  CHECK(contains(parsed.out, "statusjob 2 running:all_reduce #"));
  CHECK(count_of(parsed.out, "of group 0:True:True") == 2);

  // --watch: a second reading gives steps/s.
  Process watch(e2e::ddprun({"status", "--json", "--watch", "0.5"}), runtime_env(runtime));
  REQUIRE(watch.wait_for_stdout([](const std::string& o) { return count_of(o, "\"run_id\"") >= 2; }, 10s));
  watch.send_signal(SIGINT);
  watch.wait(5s);
  auto second = lines_of(watch.out()).at(1);
  CHECK(contains(second, "\"steps_per_s\":"));
  CHECK(!contains(second, "\"steps_per_s\":null"));

  p.send_signal(SIGTERM);
  REQUIRE(p.wait(30s).has_value());
  CHECK(std::filesystem::is_empty(dir));
  auto after = run(e2e::ddprun({"status"}), runtime_env(runtime), 10s);
  CHECK(after.status == 1);
  CHECK(contains(after.err, "no running ddprun job"));
}

TEST_CASE("ddprun status removes the stale runtime file of a dead ddprun and says so", "[e2e][status]") {
  TempDir runtime;
  std::filesystem::create_directory(runtime / "ddprun");
  std::filesystem::permissions(runtime / "ddprun", std::filesystem::perms::owner_all);
  // A pid that no longer runs: a child already reaped.
  auto gone = run({"/bin/sh", "-c", "echo $$"});
  std::string text = "run_id=deadjob\npid=" + lines_of(gone.out).at(0) +
                     "\nstore_addr=127.0.0.1\nstore_port=1\nattempt=0\nworld_size=2\n";
  write_file(runtime / "ddprun" / ("deadjob." + lines_of(gone.out).at(0)), text);
  auto r = run(e2e::ddprun({"status"}), runtime_env(runtime), 10s);
  CHECK(r.status == 1);
  CHECK(contains(r.err, "is stale: its ddprun (pid " + lines_of(gone.out).at(0) + ", job deadjob) is gone; removed it"));
  CHECK(std::filesystem::is_empty(runtime / "ddprun"));
}

TEST_CASE("ddprun status finds a daemon-served job through --rdzv_endpoint and --rdzv_id", "[e2e][status]") {
  DaemonJob d;
  const std::string& endpoint = d.endpoint;
  Process job(e2e::ddprun({"--nproc_per_node=2", endpoint, "--rdzv_id=daemonjob", e2e::kWorker, "progress", "steady"}),
              d.env());
  ProcessOptions status_env = daemon_only_env(d.dir);
  RunResult r = d.status_showing("daemonjob", 2);
  INFO(r.out << r.err << job.err());
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "\"run_id\":\"daemonjob\",\"attempt\":0,\"world_size\":2"));
  CHECK(count_of(r.out, "\"state\":\"running\"") == 2);
  // A wrong token is refused with one message.
  status_env.set_env["DDPRUN_TOKEN"] = "wrong";
  auto refused = run(e2e::ddprun({"status", endpoint, "--rdzv_id=daemonjob"}), status_env, 20s);
  CHECK(refused.status == 1);
  CHECK(contains(refused.err, "cannot reach job daemonjob's store"));
  job.send_signal(SIGTERM);
  REQUIRE(job.wait(30s).has_value());
}

TEST_CASE("a runtime worker stuck in compute gets a report naming its rank and op and sequence number",
          "[e2e][stall][recorder]") {
  TempDir runtime;
  ProcessOptions env = runtime_env(runtime);
  env.set_env["DDP_TIMEOUT_SEC"] = "120";
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--stall_timeout=3", "--stall_action=stop",
                         "--grace_period=2", kCollectiveWorker, "stuck", "1"}),
            env);
  auto status = p.wait(90s);
  INFO(p.err() << p.out());
  REQUIRE(status.has_value());
  CHECK(*status == 124);
  CHECK(contains(p.err(), "rank 1 never arrived at all_reduce #"));
  CHECK(contains(p.err(), "of group 0, which rank 0 waits in"));
  CHECK(contains(p.err(), "native stacks (gdb):"));
}

TEST_CASE("status is a subcommand only as the first argument and bad status flags get one line", "[e2e][status]") {
  TempDir dir;
  ProcessOptions env = with_stand_in(dir, "status", "#!/bin/sh\necho \"program status ran with $1\"\n");
  auto program = run(e2e::ddprun({"--standalone", "--", "status", "x"}), env);
  INFO(program.err);
  CHECK(program.status == 0);
  CHECK(contains(program.out, "[rank0]:program status ran with x"));
  for (auto args : {std::vector<std::string>{"status", "--bogus"}, {"status", "--watch=0"},
                    {"status", "--rdzv_endpoint=127.0.0.1:1"}, {"status", "--rdzv_endpoint=host:noport", "--rdzv_id=a"}}) {
    auto r = run(e2e::ddprun(args), env, 10s);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(lines_of(r.err).size() == 1);
    CHECK(contains(r.err, "ddprun status: "));
  }
}

TEST_CASE("stall timeout 0 turns stall detection off", "[e2e][stall]") {
  TempDir runtime;
  // A failed call would be reported at once (see above); with detection off nothing comes.
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--stall_timeout=0", "--grace_period=2", e2e::kWorker,
                         "progress", "fail", "1", "2"}),
            runtime_env(runtime));
  onset_of(p, 2);
  expect_no_stall_report(p, 4s);
}

// ---------------------------------------------------------------------------
// Plain workers (no progress records): the CPU-time fallback.
// ---------------------------------------------------------------------------

TEST_CASE("plain workers that sleep get one process-level report and the job goes on", "[e2e][stall]") {
  TempDir runtime;
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--stall_timeout=2", "--grace_period=2", "/bin/sh",
                         "-c", "echo started-$RANK; sleep 60"}),
            runtime_env(runtime));
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return count_of(o, "started-") == 2; }, 30s));
  double onset = p.seconds_since_start();
  auto reported = wait_for_stderr(p, [](const std::string& e) { return contains(e, "The job goes on"); }, 40s);
  INFO(p.err());
  REQUIRE(reported);
  CHECK(*reported - onset < 2 + 12);  // the timeout, then gdb on two workers; margin for a loaded machine
  const std::string err = p.err();
  CHECK(contains(err, ": no worker used CPU time for "));
  CHECK(contains(err, "no rank publishes progress records and every worker of node 0 is idle"));
  CHECK(contains(err, "no rank published a progress record (workers that do not use the ddprun runtime)"));
  CHECK(count_of(err, ": alive, state S (sleeping)") == 2);
  CHECK(count_of(err, "native stacks (gdb):") == 2);
  expect_once_per_episode(p);
}

TEST_CASE("plain workers that compute get no stall report", "[e2e][stall]") {
  TempDir runtime;
  // Rank 0 computes; rank 1 sleeps: one busy worker is progress enough.
  std::string script = "echo started-$RANK; if [ \"$RANK\" = 0 ]; then while :; do :; done; else exec sleep 60; fi";
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--stall_timeout=2", "--grace_period=2", "/bin/sh",
                         "-c", script}),
            runtime_env(runtime));
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return count_of(o, "started-") == 2; }, 30s));
  expect_no_stall_report(p, 5s);
}

TEST_CASE("plain workers that sleep are stopped by stall action stop", "[e2e][stall]") {
  TempDir runtime;
  Process p(e2e::ddprun({"--nproc_per_node=1", "--standalone", "--stall_timeout=2", "--stall_action=stop",
                         "--grace_period=2", "/bin/sh", "-c", "sleep 60"}),
            runtime_env(runtime));
  auto status = p.wait(60s);
  INFO(p.err());
  REQUIRE(status.has_value());
  CHECK(*status == 124);
  CHECK(contains(p.err(), "Root cause (ddprun stopped a stalled job, --stall_action=stop):"));
  CHECK(contains(p.err(), "every worker of node 0 is idle"));
}

// ---------------------------------------------------------------------------
// A debugger that runs out of time (a stand-in gdb first on PATH).
// ---------------------------------------------------------------------------

TEST_CASE("a debugger that runs out of time leaves the worker running and the job goes on", "[e2e][stall]") {
  TempDir dir;
  // Stops the worker as a ptrace attach does, ignores SIGTERM, never ends by itself.
  ProcessOptions env = with_stand_in(dir, "gdb", "#!/bin/sh\nkill -STOP \"$2\"\ntrap '' TERM\nexec sleep 120\n");
  // The worker sleeps past the stall timeout, then says so: it can only if it was continued.
  Process p(e2e::ddprun({"--nproc_per_node=1", "--standalone", "--stall_timeout=2", "--grace_period=2", "/bin/sh",
                         "-c", "echo started; sleep 4; echo resumed; exec sleep 60"}),
            env);
  REQUIRE(p.wait_for_stdout([](const std::string& o) { return contains(o, "started"); }, 30s));
  auto reported = wait_for_stderr(p, [](const std::string& e) { return contains(e, "The job goes on"); }, 60s);
  INFO(p.err() << p.out());
  REQUIRE(reported);
  CHECK(contains(p.err(), "(gave up after 10.0 s)"));
  CHECK(p.wait_for_stdout([](const std::string& o) { return contains(o, "resumed"); }, 20s));
  CHECK(!p.wait(0ms).has_value());
  p.send_signal(SIGTERM);
  REQUIRE(p.wait(60s).has_value());
}

// ---------------------------------------------------------------------------
// ddprun status and a malformed node registration on the daemon.
// ---------------------------------------------------------------------------

TEST_CASE("ddprun status refuses a malformed node registration with one message", "[e2e][status]") {
  TempDir dir;
  int port = e2e::free_port();
  auto daemon = start_daemon(dir, port);
  ProcessOptions status_env = daemon_only_env(dir);
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(port);
  struct Case {
    std::string job;
    std::vector<std::string> nprocs;  // one registration per node
    std::string message;
  };
  const std::vector<Case> cases = {
      {"negative", {"-5"}, "the registration of node 0 (attempt 0) is malformed: its worker count is \"-5\""},
      {"huge", {"2", "99999999999999"}, "the registration of node 1 (attempt 0) is malformed"},
      {"junk", {"4x"}, "its worker count is \"4x\", not a number from 1 to 65536"},
      {"total", std::vector<std::string>(17, "65536"), "node registrations add up to more than 1048576 workers"},
  };
  for (const Case& c : cases) {
    rdzv::TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = static_cast<uint16_t>(port);
    o.token = "status-secret";
    o.ns = c.job;
    rdzv::TcpStore store(o);
    for (size_t n = 0; n < c.nprocs.size(); ++n) {
      store.set(ddp::contract::JobKeys(0).node(static_cast<int>(n)), "host\n127.0.0.1:1\n" + c.nprocs[n] + "\n");
    }
    auto r = run(e2e::ddprun({"status", endpoint, "--rdzv_id=" + c.job}), status_env, 20s);
    INFO(c.job << ": " << r.out << r.err);
    CHECK(r.status == 1);
    CHECK(contains(r.err, c.message));
    CHECK(lines_of(r.err).size() == 1);
  }
}

TEST_CASE("ddprun status looks at an elastic job's newest attempts only, whatever round its record claims",
          "[e2e][status]") {
  TempDir dir;
  int port = e2e::free_port();
  auto daemon = start_daemon(dir, port);
  rdzv::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = static_cast<uint16_t>(port);
  o.token = "status-secret";
  o.ns = "farround";
  rdzv::TcpStore store(o);
  store.set(ddp::contract::JobKeys::elastic_round(), std::to_string(1 << 30));  // no attempt closed
  auto r = run(e2e::ddprun({"status", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=farround"}),
               daemon_only_env(dir), 20s);
  INFO(r.out << r.err);
  CHECK(r.status == 1);
  CHECK(r.seconds < 5);  // 16 round trips, not 2^30
  CHECK(contains(r.err, "job farround is an elastic job with no member list closed in its newest 16 attempts "
                        "(1073741809 to 1073741824; older ones not looked at)"));
  CHECK(lines_of(r.err).size() == 1);
}

TEST_CASE("ddprun status finds an elastic job's ranks through --rdzv_endpoint and --rdzv_id", "[e2e][status]") {
  DaemonJob d;
  // Two elastic nodes of one worker each: the round closes with both (MAX) at once.
  std::vector<std::unique_ptr<Process>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(std::make_unique<Process>(
        e2e::ddprun({"--nnodes=1:2", "--nproc_per_node=1", d.endpoint, "--rdzv_id=elasticjob", e2e::kWorker,
                     "progress", "steady"}),
        d.env()));
  }
  RunResult r = d.status_showing("elasticjob", 2);
  INFO(r.out << r.err << nodes[0]->err() << nodes[1]->err());
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "\"run_id\":\"elasticjob\",\"attempt\":0,\"world_size\":2"));
  CHECK(count_of(r.out, "\"state\":\"running\"") == 2);
  auto table = run(e2e::ddprun({"status", d.endpoint, "--rdzv_id=elasticjob"}), daemon_only_env(d.dir), 10s);
  CHECK(table.status == 0);
  CHECK(!contains(table.err, "no node registered"));
  for (auto& node : nodes) node->send_signal(SIGTERM);
  for (auto& node : nodes) REQUIRE(node->wait(30s).has_value());
}

TEST_CASE("a worker stopped with SIGSTOP is named in the stall report's headline", "[e2e][stall][recorder]") {
  TempDir runtime;
  ProcessOptions env = runtime_env(runtime);
  env.set_env["DDP_TIMEOUT_SEC"] = "120";
  // Rank 1 sleeps after the barrier (stopped there), ranks 0 and 2 wait in the all_reduce after it.
  Process p(e2e::ddprun({"--nproc_per_node=3", "--standalone", "--stall_timeout=2", "--grace_period=2",
                         kCollectiveWorker, "stuck", "1"}),
            env);
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return contains(out, "rank 1: stuck at"); }, 30s));
  const pid_t victim = worker_pid(p.pid(), 1);
  REQUIRE(victim > 0);
  REQUIRE(kill(victim, SIGSTOP) == 0);
  auto reported = wait_for_stderr(p, [](const std::string& err) { return contains(err, "stall report for job"); }, 40s);
  INFO(p.err());
  REQUIRE(reported.has_value());
  CHECK(contains(p.err(), "rank 1 (pid " + std::to_string(victim) +
                              ") is stopped (SIGSTOP): the others wait for it in all_reduce #"));
  CHECK(!p.wait(0ms).has_value());  // report only: the job goes on
  p.send_signal(SIGTERM);
  REQUIRE(p.wait(30s).has_value());
}

TEST_CASE("no stall is reported while the node stops its workers", "[e2e][stall]") {
  TempDir runtime;
  // Workers that ignore SIGTERM hold the stop for the grace period, rank 0 waiting in
  // all_reduce #4 all along: longer than --stall_timeout, but the job is being stopped.
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--stall_timeout=2", "--grace_period=6", "--",
                         "/bin/sh", "-c", "trap '' TERM INT; exec \"$0\" progress stall 1 3", e2e::kWorker}),
            runtime_env(runtime));
  onset_of(p, 2);
  p.send_signal(SIGTERM);
  auto status = p.wait(30s);
  INFO(p.err());
  REQUIRE(status.has_value());
  CHECK(p.seconds_since_start() > 6);  // the workers held the stop: the stall timeout passed meanwhile
  CHECK(!contains(p.err(), "stall"));
}
