// Job ids end to end: the ids ddprun (--rdzv_id), `ddprun status --run_id` and
// `ddp-rendezvous credential --job` accept are one set, and a launch that reuses a
// running job's id on a daemon with another shape is refused, naming both shapes,
// while the running job goes on. The real ddprun, daemon and workers on loopback.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "e2e.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kRendezvousBin = RENDEZVOUS_BIN;

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// The one line every refused id gets, after the program's prefix.
std::string refusal(const std::string& flag, const std::string& shown) {
  return "invalid " + flag + " '" + shown + "': expected 1 to 128 letters, digits, '.', '_' or '-' (not '.' or '..')";
}

// A ddp-rendezvous on loopback taking token `secret`, and the environment of the ddprun
// processes that use it (this test's runtime folder, so `ddprun status` sees only them).
struct Daemon {
  Daemon(const TempDir& dir, const std::string& secret) : port(e2e::free_port()) {
    write_file(dir / "token", secret + "\n");
    process = std::make_unique<Process>(std::vector<std::string>{kRendezvousBin, "--host=127.0.0.1",
                                                                 "--port=" + std::to_string(port), "--token-file",
                                                                 (dir / "token").string()});
    REQUIRE(process->wait_for_stdout([](const std::string& o) { return contains(o, "listening"); }, 10s));
    env.set_env["DDPRUN_TOKEN"] = secret;
    env.set_env["XDG_RUNTIME_DIR"] = dir.path().string();
  }
  void stop() {
    process->send_signal(SIGTERM);
    REQUIRE(process->wait(10s).has_value());
  }
  int port;
  std::unique_ptr<Process> process;
  ProcessOptions env;
};

}  // namespace

TEST_CASE("job ids outside letters, digits, '.', '_' and '-' are refused alike by ddprun, status and the daemon",
          "[e2e][job_id]") {
  TempDir dir;
  write_file(dir / "secret", "a-secret\n");
  const std::string secret = (dir / "secret").string();
  auto marker = (dir / "started").string();
  struct Case {
    std::string id, shown;
  };
  const std::vector<Case> bad = {{"a\nb", "a\\x0ab"}, {"with space", "with space"}, {"a/b", "a/b"},
                                 {"tab\there", "tab\\x09here"}, {"..", ".."}, {std::string(129, 'x'), std::string(128, 'x') + "..."},
                                 {"caf\xc3\xa9", "caf\\xc3\\xa9"}};
  for (const auto& c : bad) {
    INFO("id: " << c.shown);
    auto credential = run({kRendezvousBin, "credential", "--job", c.id, "--secret-file", secret}, {}, 10s);
    CHECK(credential.status == 2);
    CHECK(credential.out.empty());
    CHECK(lines_of(credential.err) ==
          std::vector<std::string>{"ddp-rendezvous: error: credential: " + refusal("--job", c.shown)});

    auto launch = run(e2e::ddprun({"--rdzv_id", c.id, e2e::kWorker, "touch", marker}), {}, 10s);
    CHECK(launch.status == 2);
    CHECK(lines_of(launch.err) == std::vector<std::string>{"ddprun: error: " + refusal("--rdzv_id", c.shown)});

    auto status = run(e2e::ddprun({"status", "--run_id", c.id}), {}, 10s);
    CHECK(status.status == 2);
    CHECK(contains(status.err, refusal("--run_id", c.shown)));
  }
  CHECK(!std::filesystem::exists(marker));  // no worker started

  // The longest and most varied id that is valid still makes a credential.
  const std::string good = "Job_7.a-" + std::string(120, 'z');
  auto credential = run({kRendezvousBin, "credential", "--job", good, "--secret-file", secret}, {}, 10s);
  CHECK(credential.status == 0);
  CHECK(lines_of(credential.out).size() == 1);
  CHECK(lines_of(credential.out).at(0).size() == 64);
}

TEST_CASE("a launch reusing a running job's id on a daemon with another shape is refused and the job goes on",
          "[e2e][job_id]") {
  TempDir dir;
  Daemon daemon(dir, "shape-secret");
  const ProcessOptions& env = daemon.env;
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(daemon.port);
  auto node = [&](const std::string& nnodes, int rank, int nproc, std::vector<std::string> program) {
    std::vector<std::string> a = {"--nnodes=" + nnodes, "--node_rank=" + std::to_string(rank),
                                  "--nproc_per_node=" + std::to_string(nproc), endpoint, "--rdzv_id=shared",
                                  "--join_timeout=30"};
    a.insert(a.end(), program.begin(), program.end());
    return e2e::ddprun(a);
  };
  // The running job: 2 nodes × 2 processes, its workers waiting for SIGTERM.
  const std::vector<std::string> waiting = {e2e::kWorker, "trap", std::to_string(SIGTERM)};
  Process n0(node("2", 0, 2, waiting), env);
  Process n1(node("2", 1, 2, waiting), env);
  // Each node's ranks (0-1 on node 0, 2-3 on node 1) said "ready".
  auto ready = [](int first) {
    return [first](const std::string& out) {
      auto ranks = e2e::by_rank(out);
      for (int r = first; r < first + 2; ++r) {
        if (std::find(ranks[r].begin(), ranks[r].end(), "ready") == ranks[r].end()) return false;
      }
      return true;
    };
  };
  REQUIRE(n0.wait_for_stdout(ready(0), 30s));
  REQUIRE(n1.wait_for_stdout(ready(2), 30s));

  TempDir other;
  const std::vector<std::string> touch = {e2e::kWorker, "touch", (other / "started").string()};
  struct Case {
    std::string nnodes;
    int rank, nproc;
    std::string message;
  };
  const std::vector<Case> refused = {
      {"3", 1, 2, "rendezvous: job 'shared' is already running with 2 nodes × 2 processes; this launch asks for "
                  "3 nodes × 2 processes"},
      {"1:3", 0, 2, "rendezvous: job 'shared' is already running with 2 nodes × 2 processes; this launch asks for "
                    "1:3 nodes × 2 processes"},
      {"2", 1, 1, "rendezvous: job 'shared' is already running with 2 nodes, node rank 1 with 2 processes; this "
                  "launch asks for node rank 1 with 1 process"},
  };
  for (const auto& c : refused) {
    auto r = run(node(c.nnodes, c.rank, c.nproc, touch), env, 20s);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(r.seconds < 10);
    auto lines = lines_of(r.err);
    REQUIRE(!lines.empty());
    CHECK_THAT(lines.back(), Catch::StartsWith("ddprun: error: " + c.message));
  }
  CHECK(!std::filesystem::exists(other / "started"));

  // The job was not disturbed: still running, and it ends cleanly when stopped.
  CHECK(!n0.wait(0ms).has_value());
  CHECK(!n1.wait(0ms).has_value());
  CHECK(!contains(n0.err() + n1.err(), "failed"));
  n0.send_signal(SIGTERM);
  n1.send_signal(SIGTERM);
  REQUIRE(n0.wait(30s).has_value());
  REQUIRE(n1.wait(30s).has_value());
  CHECK(!contains(n0.err() + n1.err(), "rendezvous: job"));
  daemon.stop();
}

TEST_CASE("a misconfigured node that waits for node 0 is the one refused, not node 0", "[e2e][job_id]") {
  TempDir dir;
  Daemon daemon(dir, "order-secret");
  ProcessOptions env = daemon.env;
  env.set_env["DDP_WAIT_NOTICE_SEC"] = "1";  // the wait says so within a second
  auto node = [&](int nnodes, int rank, const std::string& marker) {
    return e2e::ddprun({"--nnodes=" + std::to_string(nnodes), "--node_rank=" + std::to_string(rank),
                        "--nproc_per_node=1", "--rdzv_endpoint=127.0.0.1:" + std::to_string(daemon.port),
                        "--rdzv_id=ordered", "--join_timeout=30", e2e::kWorker, "touch", (dir / marker).string()});
  };
  // The wrong node 1 (--nnodes=3) comes first and waits for node 0's run id.
  Process wrong(node(3, 1, "wrong"), env);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!contains(wrong.err(), "waiting for node 0") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE(contains(wrong.err(), "waiting for node 0"));
  Process n0(node(2, 0, "n0"), env);
  auto refused = wrong.wait(20s);
  REQUIRE(refused.has_value());
  CHECK(*refused == 2);
  CHECK(contains(wrong.err(), "rendezvous: job 'ordered' is already running with 2 nodes × 1 process; this launch "
                              "asks for 3 nodes × 1 process"));
  // Node 0 was not refused: it still waits, and the right node 1 completes the job with it.
  CHECK(!n0.wait(0ms).has_value());
  auto right = run(node(2, 1, "n1"), env, 30s);
  INFO(right.err);
  CHECK(right.status == 0);
  auto first = n0.wait(30s);
  REQUIRE(first.has_value());
  CHECK(*first == 0);
  CHECK(!contains(n0.err(), "rendezvous: job"));
  CHECK(std::filesystem::exists(dir / "n0"));
  CHECK(std::filesystem::exists(dir / "n1"));
  CHECK(!std::filesystem::exists(dir / "wrong"));
  daemon.stop();
}

TEST_CASE("nodes with and without --node_rank in one job: the later one is refused, the job goes on",
          "[e2e][job_id]") {
  // Without --node_rank an endpoint's nodes take ranks by arrival (torchrun's c10d); a
  // node with one would wait under other keys forever. The daemon has the endpoint's port.
  TempDir dir;
  Daemon daemon(dir, "mixed-secret");
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(daemon.port);
  auto node = [&](std::vector<std::string> rank, const std::string& marker) {
    std::vector<std::string> a = {"--nnodes=2", "--nproc_per_node=1", endpoint, "--join_timeout=30"};
    a.insert(a.end(), rank.begin(), rank.end());
    a.insert(a.end(), {e2e::kWorker, "touch", (dir / marker).string()});
    return e2e::ddprun(a);
  };
  ProcessOptions env = daemon.env;
  env.set_env["DDP_WAIT_NOTICE_SEC"] = "1";  // the wait says so within a second
  Process first(node({}, "first"), env);  // ranks by arrival, run id none
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!contains(first.err(), "still waiting for attempt 0 to form") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE(contains(first.err(), "still waiting for attempt 0 to form"));  // its shape is recorded
  auto ranked = run(node({"--node_rank=1"}, "ranked"), env, 30s);
  CHECK(ranked.status == 2);
  CHECK(contains(ranked.err, "rendezvous: job 'none' is already running with nodes that take their rank by "
                             "arrival; this one gives --node_rank: give every node of a job its --node_rank, or none"));
  CHECK(!first.wait(0ms).has_value());
  auto second = run(node({}, "second"), env, 30s);
  INFO(second.err);
  CHECK(second.status == 0);
  auto ended = first.wait(30s);
  REQUIRE(ended.has_value());
  CHECK(*ended == 0);
  CHECK(std::filesystem::exists(dir / "first"));
  CHECK(std::filesystem::exists(dir / "second"));
  CHECK(!std::filesystem::exists(dir / "ranked"));
  daemon.stop();
}

TEST_CASE("with --rdzv_backend=c10d two nodes giving the same --node_rank take ranks by arrival as under torchrun",
          "[e2e][job_id]") {
  // torchrun ignores --node_rank with the c10d backend; so does ddprun, and says so. The
  // first ddprun binds the endpoint's port and hosts the store, the second connects.
  TempDir dir;
  const std::string endpoint = "--rdzv_endpoint=localhost:" + std::to_string(e2e::free_port());
  auto node = [&](const std::string& marker) {
    return e2e::ddprun({"--nnodes=2", "--nproc_per_node=1", "--node_rank=1", "--rdzv_backend=c10d", endpoint,
                        "--join_timeout=30", e2e::kWorker, "touch", (dir / marker).string()});
  };
  ProcessOptions env;
  env.set_env["XDG_RUNTIME_DIR"] = dir.path().string();
  Process first(node("first"), env);
  auto second = run(node("second"), env, 40s);
  INFO(second.err);
  CHECK(second.status == 0);
  CHECK(contains(second.err, "node_rank is only used for static rdzv_backend. It will be ignored for "
                             "rdzv_backend=c10d"));
  auto ended = first.wait(30s);
  REQUIRE(ended.has_value());
  INFO(first.err());
  CHECK(*ended == 0);
  CHECK(std::filesystem::exists(dir / "first"));
  CHECK(std::filesystem::exists(dir / "second"));
}
