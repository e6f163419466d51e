// Every phase answers a stop signal: the real ddprun, waiting for what never comes (a
// store nobody serves, node 0 of a fixed job, the other node of an attempt, the other
// node's end), gets SIGINT, SIGTERM or SIGHUP and exits with 128+signal soon after,
// having said what it waited for; and a stopped worker does not hold a stop for the
// grace period. Nodes are ddprun processes on loopback; the daemon is ddp-rendezvous.
// The bounds leave room for a loaded machine: scripts/bench/signals measures the figures.
#include <catch2/catch.hpp>
#include <signal.h>
#include <string.h>

#include <algorithm>
#include <regex>
#include <thread>

#include "e2e.hpp"

using namespace testing;

namespace {

const std::string kRendezvousBin = RENDEZVOUS_BIN;
// From the signal to ddprun's exit, on a loaded 2-core machine (the target is 1 s).
constexpr auto kExitBound = 5s;

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// Notices every second, so a test sees the wait's line without waiting 30 s.
ProcessOptions noticing(const TempDir& dir) {
  ProcessOptions o;
  o.set_env["DDP_WAIT_NOTICE_SEC"] = "1";
  o.set_env["DDPRUN_TOKEN"] = "signals-secret";
  o.set_env["XDG_RUNTIME_DIR"] = dir.path().string();  // `ddprun status` sees only this test's jobs
  return o;
}

// Polls what `p` wrote on stderr until it holds `what`; false after `limit`.
bool said(const Process& p, const std::string& what, std::chrono::milliseconds limit = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!contains(p.err(), what)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

// A ddp-rendezvous on loopback (token "signals-secret"), on the port it picked.
struct Daemon {
  explicit Daemon(const TempDir& dir) {
    write_file(dir / "token", "signals-secret\n");
    process = std::make_unique<Process>(std::vector<std::string>{kRendezvousBin, "--host=127.0.0.1", "--port=0",
                                                                 "--token-file", (dir / "token").string()});
    std::smatch m;
    const std::regex listening(R"(listening on [^ ]*:(\d+) )");
    REQUIRE(process->wait_for_stdout(
        [&](const std::string& out) { return std::regex_search(out, m, listening); }, 10s));
    std::string out = process->out();
    REQUIRE(std::regex_search(out, m, listening));
    endpoint = "--rdzv_endpoint=127.0.0.1:" + m[1].str();
  }
  std::unique_ptr<Process> process;
  std::string endpoint;
};

std::string abbrev(int sig) { return std::string("SIG") + sigabbrev_np(sig); }

// Sends `sig` once `p` said `waiting`; then it must exit with 128+sig within kExitBound,
// saying `stopped`.
void expect_stop(Process& p, const std::string& waiting, int sig, const std::string& stopped) {
  REQUIRE(said(p, waiting));
  const e2e::Ended end = e2e::signal_and_wait(p, sig, kExitBound + 5s);
  INFO(p.err());
  REQUIRE(end.status.has_value());
  CHECK(*end.status == 128 + sig);
  CHECK(end.seconds < std::chrono::duration<double>(kExitBound).count());
  CHECK(contains(p.err(), stopped));
}

}  // namespace

TEST_CASE("connecting to a store nobody serves: INT, TERM and HUP end ddprun at once with 128+signal",
          "[e2e][signals]") {
  const int sig = GENERATE(SIGINT, SIGTERM, SIGHUP);
  TempDir dir;
  const int port = free_port();
  // is_host=false: this node only connects (as the other nodes of a c10d endpoint do).
  Process p(e2e::ddprun({"--nnodes=2", "--rdzv_id=sig-connect", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                         "--rdzv_conf=is_host=false", "/bin/true"}),
            noticing(dir));
  expect_stop(p, "still waiting for the store at 127.0.0.1:" + std::to_string(port) + ": Connection refused", sig,
              "received " + abbrev(sig) + " while joining the rendezvous; no worker was started");
}

TEST_CASE("joining a fixed job whose node 0 never comes: SIGTERM ends node 1 with 143", "[e2e][signals]") {
  TempDir dir;
  Daemon daemon(dir);
  Process p(e2e::ddprun({"--nnodes=2", "--node_rank=1", "--rdzv_id=sig-join", daemon.endpoint, "/bin/true"}),
            noticing(dir));
  expect_stop(p, "still waiting for node 0 to join at", SIGTERM,
              "received SIGTERM while joining the rendezvous; no worker was started");
}

TEST_CASE("node 0 waiting for the other node of a fixed job: SIGHUP ends it with 129", "[e2e][signals]") {
  TempDir dir;
  Process p(e2e::ddprun({"--nnodes=2", "--node_rank=0", "--master_addr=127.0.0.1",
                         "--master_port=" + std::to_string(free_port()), "/bin/true"}),
            noticing(dir));
  expect_stop(p, "still waiting for node rank(s) 1 of 2 to join", SIGHUP,
              "received SIGHUP while joining the rendezvous; no worker was started");
}

TEST_CASE("an elastic node waiting for the attempt to form: SIGINT ends it with 130", "[e2e][signals]") {
  TempDir dir;
  Daemon daemon(dir);
  Process p(e2e::ddprun({"--nnodes=2:3", "--rdzv_id=sig-elastic", daemon.endpoint, "/bin/true"}), noticing(dir));
  expect_stop(p, "still waiting for attempt 0 to form: 1 node(s) present, 2 to 3 wanted", SIGINT,
              "received SIGINT while joining the rendezvous; no worker was started");
}

TEST_CASE("in the exit barrier: SIGINT ends the waiting node with 130 and the job everywhere", "[e2e][signals]") {
  TempDir dir;
  const std::vector<std::string> common = {"--nnodes=2", "--master_addr=127.0.0.1",
                                           "--master_port=" + std::to_string(free_port())};
  auto args = [&](const std::string& rank, std::vector<std::string> command) {
    std::vector<std::string> a = common;
    a.push_back("--node_rank=" + rank);
    a.insert(a.end(), command.begin(), command.end());
    return e2e::ddprun(a);
  };
  Process node1(args("1", {"/bin/sleep", "120"}), noticing(dir));
  Process node0(args("0", {"/bin/true"}), noticing(dir));
  expect_stop(node0, "still waiting for node rank(s) 1 to finish", SIGINT,
              "ddprun received SIGINT while waiting for the other nodes to finish");
  // The other node hears the job failed and stops its worker.
  auto other = node1.wait(30s);
  INFO(node1.err());
  REQUIRE(other.has_value());
  CHECK(*other == 130);
  CHECK(contains(node1.err(), "ddprun received SIGINT while waiting for the other nodes to finish"));
}

TEST_CASE("a stopped worker: status says stopped, and SIGTERM ends the job long before the grace period",
          "[e2e][signals]") {
  TempDir dir;
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--rdzv_id=sig-stopped", "--grace_period=30",
                         "/bin/sleep", "120"}),
            noticing(dir));
  std::vector<pid_t> workers;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (workers.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    workers.clear();
    for (pid_t c : child_pids(p.pid())) {
      if (command_name(c) == "sleep") workers.push_back(c);
    }
  }
  REQUIRE(workers.size() == 2);
  const pid_t stopped = workers[1];
  REQUIRE(kill(stopped, SIGSTOP) == 0);

  // `ddprun status` calls it stopped (once /proc says T), the other one running.
  const std::regex stopped_row("\\n\\d+ +\\S+ +" + std::to_string(stopped) + " +stopped ");
  const std::regex running_row("\\n\\d+ +\\S+ +" + std::to_string(workers[0]) + " +running ");
  RunResult status;
  for (int tries = 0; tries < 50; ++tries) {
    status = run(e2e::ddprun({"status", "--run_id", "sig-stopped"}), noticing(dir), 30s);
    if (std::regex_search(status.out, stopped_row)) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(status.out << status.err);
  CHECK(status.status == 0);
  CHECK(std::regex_search(status.out, stopped_row));
  CHECK(std::regex_search(status.out, running_row));

  const e2e::Ended end = e2e::signal_and_wait(p, SIGTERM, 40s);
  INFO(p.err());
  REQUIRE(end.status.has_value());
  CHECK(*end.status == 143);
  CHECK(end.seconds < std::chrono::duration<double>(kExitBound).count());  // the grace period is 30 s
  CHECK(std::regex_search(p.err(), std::regex("rank [01] \\(pid " + std::to_string(stopped) +
                                               "\\) was stopped \\(SIGSTOP\\); continued it so it can terminate")));
  CHECK(!contains(p.err(), "grace period over"));
  for (pid_t w : workers) CHECK(!process_alive(w));
}

TEST_CASE("a worker stopped again after the stop's SIGTERM and SIGCONT still ends long before the grace period",
          "[e2e][signals]") {
  TempDir dir;
  Process p(e2e::ddprun({"--nproc_per_node=1", "--standalone", "--rdzv_id=sig-restopped", "--grace_period=30",
                         e2e::kWorker, "term-slowly", "1000"}),
            noticing(dir));
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return e2e::all_ranks_said(out, 1, "ready"); }, 30s));
  std::vector<pid_t> workers;
  for (pid_t c : child_pids(p.pid())) {
    if (command_name(c) == "test_worker") workers.push_back(c);
  }
  REQUIRE(workers.size() == 1);
  p.send_signal(SIGTERM);
  const auto sent = std::chrono::steady_clock::now();
  // The worker got ddprun's SIGTERM (so ddprun's first SIGCONT is behind it); stop it again.
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return e2e::all_ranks_said(out, 1, "got SIGTERM"); }, 10s));
  REQUIRE(kill(workers[0], SIGSTOP) == 0);
  const auto status = p.wait(40s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  INFO(p.err());
  REQUIRE(status.has_value());
  CHECK(*status == 143);
  CHECK(seconds < 4);  // its 1 s wind-down, continued within about a second; the grace period is 30 s
  const std::string continued =
      "rank 0 (pid " + std::to_string(workers[0]) + ") was stopped (SIGSTOP); continued it so it can terminate";
  const std::string err = p.err();
  CHECK(err.find(continued) != std::string::npos);
  CHECK(err.find(continued) == err.rfind(continued));  // said once
  CHECK(!contains(err, "grace period over"));
  CHECK(!process_alive(workers[0]));
}
