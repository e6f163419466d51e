// A launch from one command with agents on this machine (`ddprun --hosts
// localhost:2,127.0.0.1:1`): every host of the list that is this machine gets a local
// agent, so the whole path (store in the launcher, handoff on stdin, output relay,
// one failure summary, stop, the launcher's death) runs for real without ssh. A fake
// `ssh` first in PATH (it runs the remote command line here with sh -c, or fails as
// ssh does) covers the ssh command line and an unreachable host; real sshd hosts are
// the ssh end-to-end suite's.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <thread>

#include "e2e.hpp"

using namespace testing;

namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every process below `pid` (agents, their guards, workers, ...).
std::vector<pid_t> descendants(pid_t pid) {
  std::vector<pid_t> out;
  for (pid_t child : child_pids(pid)) {
    out.push_back(child);
    for (pid_t d : descendants(child)) out.push_back(d);
  }
  return out;
}

bool all_gone_within(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  auto alive = [&] { return std::any_of(pids.begin(), pids.end(), [](pid_t p) { return process_alive(p); }); };
  while (alive() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  return !alive();
}

// A directory with a fake `ssh`: it runs the remote command (its last argument) here
// through sh -c, as sshd would through the user's shell, or (mode "refuse") fails as
// ssh does when it cannot connect. In mode "run" it keeps its arguments and its
// environment in DIR/ssh_args and DIR/ssh_env; in mode "cut" the remote command's
// stdin ends once the file DIR/cut exists (as when the connection's input is lost).
ProcessOptions with_fake_ssh(const TempDir& dir, const std::string& mode) {
  const std::string cut = (dir / "cut").string();
  std::string script =
      mode == "refuse"
          ? "#!/bin/sh\necho \"ssh: connect to host somewhere port 22: Connection refused\" >&2\nexit 255\n"
      : mode == "cut"
          ? "#!/bin/sh\nfor last; do :; done\n{ sed '/^end$/q'; while [ ! -e " + cut +
                " ]; do sleep 0.1; done; } | sh -c \"$last\"\n"
          : "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + (dir / "ssh_args").string() + "\nenv > " +
                (dir / "ssh_env").string() + "\nfor last; do :; done\nexec sh -c \"$last\"\n";
  write_file(dir / "ssh", script, true);
  ProcessOptions o;
  o.set_env["PATH"] = dir.path().string() + ":" + (getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
  return o;
}

}  // namespace

TEST_CASE("local agents run one job: ranks, world size and group ranks follow the host list", "[e2e][remote]") {
  auto r = run(e2e::ddprun({"--hosts", "localhost:2,127.0.0.1:1", e2e::kWorker, "env", "RANK", "WORLD_SIZE",
                            "GROUP_RANK", "LOCAL_RANK", "GROUP_WORLD_SIZE"}),
               {}, 60s);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks.size() == 3);
  for (int rank = 0; rank < 3; ++rank) {
    const auto& lines = ranks[rank];
    auto has = [&](const std::string& l) { return std::find(lines.begin(), lines.end(), l) != lines.end(); };
    CHECK(has("RANK=" + std::to_string(rank)));
    CHECK(has("WORLD_SIZE=3"));
    CHECK(has("GROUP_WORLD_SIZE=2"));
    CHECK(has(std::string("GROUP_RANK=") + (rank < 2 ? "0" : "1")));
    CHECK(has(std::string("LOCAL_RANK=") + (rank == 1 ? "1" : "0")));
  }
}

TEST_CASE("a failing worker on the second host ends the job with one summary naming host and rank", "[e2e][remote]") {
  auto r = run(e2e::ddprun({"--hosts", "localhost:2,127.0.0.1:2", "--grace_period", "3", e2e::kWorker, "fail", "3",
                            "7"}),
               {}, 60s);
  INFO(r.out << r.err);
  CHECK(r.status == 7);
  CHECK(count_of(r.err, "Root cause") == 1);
  CHECK(count_of(r.err, "Root cause (first worker to fail)") == 1);
  CHECK(r.err.find("rank 3 (local_rank 1)") != std::string::npos);
  // The launcher's last word names the host as the host list wrote it.
  CHECK(r.err.find("failed on host 127.0.0.1: rank 3 on node 1") != std::string::npos);
  CHECK(r.err.find("exit status 7") != std::string::npos);
}

TEST_CASE("SIGINT to the launcher stops every node's workers and leaves no process", "[e2e][remote]") {
  TempDir dir;
  Process p(e2e::ddprun({"--hosts", "localhost:1,127.0.0.1:2", "--grace_period", "5", e2e::kWorker, "tree",
                         dir.path().string()}));
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return e2e::all_ranks_said(out, 3, "ready"); }, 30s));
  std::vector<pid_t> below = descendants(p.pid());
  REQUIRE(below.size() >= 2 + 3);  // two agents (with their guards) and three workers at least
  p.send_signal(SIGINT);
  auto status = p.wait(20s);
  REQUIRE(status.has_value());
  INFO(p.err());
  CHECK(*status == 128 + SIGINT);
  CHECK(p.seconds_since_start() > 0);
  // Workers, the grandchildren in their groups, agents, guards: all gone. (A grandchild
  // that left its group with setsid is stopped too: the agents stop stragglers.)
  CHECK(all_gone_within(below, 2s));
  std::istringstream pids(read_file(dir / "pids.0") + read_file(dir / "pids.1") + read_file(dir / "pids.2"));
  std::vector<pid_t> tree;
  for (pid_t pid; pids >> pid;) tree.push_back(pid);
  CHECK(tree.size() == 9);
  CHECK(all_gone_within(tree, 2s));
  CHECK(p.err().find("stopped by SIGINT") != std::string::npos);
  CHECK(count_of(p.err(), "Root cause") == 0);
}

TEST_CASE("the launcher SIGKILLed: agents and workers are gone within the heartbeat timeout and 1 s",
          "[e2e][remote]") {
  // Workers that ignore SIGTERM: only the agents' capped grace period ends them.
  Process p(e2e::ddprun({"--hosts", "localhost:1,127.0.0.1:1", "--heartbeat_timeout", "4", "--grace_period", "60",
                         e2e::kWorker, "ignore-term"}));
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return e2e::all_ranks_said(out, 2, "ready"); }, 30s));
  std::vector<pid_t> below = descendants(p.pid());
  REQUIRE(below.size() >= 4);
  p.send_signal(SIGKILL);
  REQUIRE(p.wait(5s).has_value());
  auto killed = std::chrono::steady_clock::now();
  CHECK(all_gone_within(below, 5s));
  INFO("gone after " << std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count() << " s");
}

TEST_CASE("over (fake) ssh the quoted remote command runs the agent and the token stays off ssh", "[e2e][remote]") {
  TempDir dir;
  // 192.0.2.1 (TEST-NET-1) is never this machine: its agent goes through `ssh`.
  ProcessOptions options = with_fake_ssh(dir, "run");
  const std::string secret = "s3cret-token-of-this-test";
  options.set_env["DDPRUN_TOKEN"] = secret;
  auto r = run(e2e::ddprun({"--hosts", "localhost:1,192.0.2.1:1", "--local_addr", "127.0.0.1", e2e::kWorker, "env",
                            "RANK", "GROUP_RANK", "it's a value"}),
               options, 60s);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks.size() == 2);
  CHECK(std::find(ranks[1].begin(), ranks[1].end(), "GROUP_RANK=1") != ranks[1].end());
  CHECK(std::find(ranks[1].begin(), ranks[1].end(), "it's a value unset") != ranks[1].end());
  // The token went on the agent's stdin: neither ssh's command line nor its environment has it.
  std::string args = read_file(dir / "ssh_args");
  CHECK(args.find("--agent_stdin") != std::string::npos);
  CHECK(args.find("BatchMode=yes") != std::string::npos);
  CHECK(args.find(secret) == std::string::npos);
  std::string env = read_file(dir / "ssh_env");
  CHECK(env.find("PATH=") != std::string::npos);
  CHECK(env.find(secret) == std::string::npos);
}

TEST_CASE("a host ssh cannot reach fails the launch naming it and ssh's error, and stops the others",
          "[e2e][remote]") {
  TempDir dir;
  auto r = run(e2e::ddprun({"--hosts", "localhost:2,192.0.2.1:1", "--local_addr", "127.0.0.1", e2e::kWorker, "env",
                            "RANK"}),
               with_fake_ssh(dir, "refuse"), 60s);
  INFO(r.out << r.err);
  CHECK(r.status == 1);
  CHECK(r.err.find("host 192.0.2.1 (node 1): ssh failed (exit status 255): ssh: connect to host somewhere port 22: "
                   "Connection refused") != std::string::npos);
  CHECK(r.seconds < 15);
  CHECK(e2e::by_rank(r.out).empty());  // node 0 never started workers: the job never formed
}

TEST_CASE("after a restart the job's status is that of the attempt it ended in", "[e2e][remote]") {
  // Every rank exits 5 while TORCHELASTIC_RESTART_COUNT < N, then 0.
  auto restarted = [](const std::string& failing_attempts) {
    return run(e2e::ddprun({"--hosts", "localhost:2,127.0.0.1:1", "--max_restarts", "1", "--grace_period", "3",
                            e2e::kWorker, "fail-until-restart", failing_attempts}),
               {}, 60s);
  };
  SECTION("attempt 0 failed, attempt 1 succeeded: its failure stays in the store but the job exits 0") {
    auto r = restarted("1");
    INFO(r.out << r.err);
    CHECK(r.status == 0);
    CHECK(r.err.find("failed on host") == std::string::npos);
  }
  SECTION("both attempts failed: attempt 1's failure is the job's") {
    auto r = restarted("2");
    INFO(r.out << r.err);
    CHECK(r.status == 5);
    CHECK(r.err.find("failed on host") != std::string::npos);
  }
}

TEST_CASE("a worker's exit status 255 over ssh is the job's failure, not ssh's", "[e2e][remote]") {
  // ssh passes the remote command's 255 on: the agent ran, so it is no launch failure.
  TempDir dir;
  std::vector<std::string> store_flags = {"--local_addr", "127.0.0.1"};
  SECTION("node 0 hosts the store (--master_addr): the agent's status passes through") {
    store_flags = {"--master_addr", "127.0.0.1", "--master_port", std::to_string(e2e::free_port())};
  }
  SECTION("the launcher hosts the store") {}
  std::vector<std::string> args = {"--hosts", "localhost:1,192.0.2.1:1", "--grace_period", "3"};
  args.insert(args.end(), store_flags.begin(), store_flags.end());
  args.insert(args.end(), {e2e::kWorker, "fail", "1", "255"});
  auto r = run(e2e::ddprun(args), with_fake_ssh(dir, "run"), 60s);
  INFO(r.out << r.err);
  CHECK(r.status == 255);
  CHECK(r.err.find("could not start") == std::string::npos);
  CHECK(r.err.find("ssh failed") == std::string::npos);
  CHECK(r.out.find("ddprun-agent started") == std::string::npos);  // the launcher keeps its agents' "I run" line
}

TEST_CASE("every agent frozen, as if all were cut off: the launcher ends the job after its deadline",
          "[e2e][remote]") {
  // Stopped agents neither exit nor talk to the store: their wills fail the job after
  // the heartbeat timeout, and no agent is left to end by itself (as with ssh
  // connections that hang after a partition). The launcher sees the failure in its
  // store and kills them heartbeat + grace period + 10 s later.
  Process p(e2e::ddprun({"--hosts", "localhost:1,127.0.0.1:1", "--heartbeat_timeout", "2", "--grace_period", "1",
                         e2e::kWorker, "ignore-term"}));
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return e2e::all_ranks_said(out, 2, "ready"); }, 30s));
  std::vector<pid_t> below = descendants(p.pid());
  std::vector<pid_t> agents = child_pids(p.pid());
  REQUIRE(agents.size() == 2);
  for (pid_t agent : agents) kill(agent, SIGSTOP);
  auto status = p.wait(60s);
  REQUIRE(status.has_value());
  INFO(p.err());
  CHECK(*status == 75);  // a node was lost (ddprun's kExitNodeLost)
  CHECK(p.err().find("was lost") != std::string::npos);
  CHECK(p.err().find("did not end in time; killing it") != std::string::npos);
  CHECK(all_gone_within(below, 5s));
}

TEST_CASE("an agent whose link to the launcher is cut is a lost node, not a stop", "[e2e][remote]") {
  TempDir dir;
  Process p(e2e::ddprun({"--hosts", "localhost:1,192.0.2.1:1", "--local_addr", "127.0.0.1", "--grace_period", "2",
                         e2e::kWorker, "ignore-term"}),
            with_fake_ssh(dir, "cut"));
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return e2e::all_ranks_said(out, 2, "ready"); }, 30s));
  write_file(dir / "cut", "");
  auto status = p.wait(40s);
  REQUIRE(status.has_value());
  INFO(p.err());
  CHECK(*status == 75);  // a node was lost (ddprun's kExitNodeLost)
  CHECK(p.err().find("lost its connection to the launching ddprun") != std::string::npos);
  CHECK(p.err().find("ddprun received SIGTERM") == std::string::npos);  // the notice says why, not how
}

TEST_CASE("the launcher says which --rdzv_conf settings have no effect", "[e2e][remote]") {
  auto r = run(e2e::ddprun({"--hosts", "localhost:1", "--rdzv_conf", "last_call_timeout=3", e2e::kWorker, "env",
                            "RANK"}),
               {}, 60s);
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK(r.err.find("--rdzv_conf last_call_timeout has no effect") != std::string::npos);
}
