// `ddprun --hostfile` end to end: one command on a login node starts the
// whole job over real ssh. Three network-namespace hosts each run Debian's sshd with
// the test's own keys (ssh_hosts.hpp); the launcher runs in a fourth namespace that
// runs no workers. Each test checks one promise of --hostfile: ranks and node order,
// the GPUs --include picks, the variables sent and the token kept off every command
// line; a failure on one host ending all; Ctrl-C; a host that cannot be reached; a
// launcher SIGKILLed; Fashion-MNIST trained over the three hosts.
//
// "A process of the job" is any process in a host's (or the login node's) network
// namespace other than that host's sshd listener: agents, workers, their children,
// sshd's sessions, the ssh clients.
#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <regex>

#include "e2e.hpp"
#include "fashion_output.hpp"
#include "ssh_hosts.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kFashion = FASHION_MNIST_BIN;
constexpr double kTargetAccuracy = 0.885;  // the accuracy the other end-to-end trainings reach
constexpr int kHeartbeat = 3;              // --heartbeat_timeout, seconds
constexpr int kGrace = 3;                  // --grace_period, seconds

// A hostfile as OpenMPI and DeepSpeed write it, with a comment and a blank line:
// one "ADDRESS slots=N" line per entry, in the order given.
std::string write_hostfile(const SshHosts& h, const std::vector<std::pair<std::string, int>>& entries) {
  std::string text = "# hosts of this test\n\n";
  for (const auto& [address, slots] : entries) text += address + " slots=" + std::to_string(slots) + "\n";
  const auto path = h.dir() / "hostfile";
  write_file(path, text);
  return path.string();
}

// The launcher on the login node: ddprun --hostfile FILE [flags] PROGRAM..., with the
// test's ssh client as DDPRUN_SSH and `env` added to its environment.
std::unique_ptr<Process> launch(const SshHosts& h, const std::string& hostfile, std::vector<std::string> flags,
                                const std::vector<std::string>& program,
                                std::map<std::string, std::string> env = {}) {
  std::vector<std::string> argv = {e2e::kDdprun, "--hostfile", hostfile,
                                   "--heartbeat_timeout=" + std::to_string(kHeartbeat),
                                   "--grace_period=" + std::to_string(kGrace)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), program.begin(), program.end());
  ProcessOptions o;
  o.set_env = h.ssh_env();
  o.set_env.insert(env.begin(), env.end());
  return std::make_unique<Process>(h.on_login(argv), o);
}

// Waits until every rank below `world` printed `line` through the launcher; false if
// they did not in time or the launcher ended first.
bool wait_all_ranks(const Process& launcher, int world, const std::string& line,
                    std::chrono::milliseconds timeout = 60s) {
  auto all_printed = [&](const std::string& out) {
    auto r = e2e::by_rank(out);
    for (int i = 0; i < world; ++i) {
      if (std::find(r[i].begin(), r[i].end(), line) == r[i].end()) return false;
    }
    return true;
  };
  launcher.wait_for_stdout(
      [&](const std::string& out) { return all_printed(out) || !process_alive(launcher.pid()); }, timeout);
  return all_printed(launcher.out());
}

std::string transcript(const Process& launcher) {
  return "launcher stdout:\n" + launcher.out() + "launcher stderr:\n" + launcher.err();
}

// The value of "KEY=..." among a rank's lines; "<absent>" when none.
std::string value_of(const std::vector<std::string>& lines, const std::string& key) {
  for (const auto& l : lines) {
    if (l.rfind(key + "=", 0) == 0) return l.substr(key.size() + 1);
  }
  return "<absent>";
}

std::string proc_text(pid_t pid, const std::string& what) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/" + what);
  std::replace(s.begin(), s.end(), '\0', ' ');
  return s;
}

// Checks that every job process is gone within `limit` once the launcher ended.
void check_nothing_left(const SshHosts& h, std::chrono::milliseconds limit) {
  auto gone = h.wait_no_job_processes(limit);
  INFO("left on the hosts:\n" << SshHosts::describe(h.job_processes()));
  CHECK(gone.has_value());
}

}  // namespace

TEST_CASE("the ssh hosts accept the test key from the login node and run commands there", "[hostfile]") {
  SshHosts h(3);
  for (int i = 0; i < 3; ++i) {
    auto argv = h.ssh_argv();
    argv.insert(argv.end(), {"-o", "BatchMode=yes", h.address(i), "readlink /proc/self/ns/net"});
    auto r = run(h.on_login(argv), {}, 20s);
    INFO("host " << i << ": " << r.err);
    CHECK(r.status == 0);
    CHECK(r.out == "net:[" + std::to_string(h.net_namespace(i)) + "]\n");
  }
  // A key the hosts do not know is refused without a prompt.
  const std::string stranger = (h.dir() / "stranger").string();
  REQUIRE(run({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", stranger}).status == 0);
  auto r = run(h.on_login({"ssh", "-F", "none", "-i", stranger, "-o", "IdentitiesOnly=yes", "-o",
                           "UserKnownHostsFile=" + (h.dir() / "known_hosts").string(), "-o",
                           "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", h.address(0), "true"}),
               {}, 20s);
  CHECK(r.status == 255);
  CHECK_THAT(r.err, Catch::Contains("Permission denied"));
  check_nothing_left(h, 5s);
}

TEST_CASE("a 3-host launch gives ranks in file order with --include's GPUs and the variables sent but no token in ps",
          "[hostfile]") {
  SshHosts h(3);
  // Node order is the file's, not the addresses': host 2 first.
  const std::string file = write_hostfile(h, {{h.address(2), 4}, {h.address(0), 4}, {h.address(1), 4}});
  write_file(h.dir() / "job.env", "# sent from a file\nHSSH_FROM_FILE=a=b c\n");
  const std::string go = (h.dir() / "go").string();
  // Each worker prints its variables and its host (network namespace), then waits for
  // the test to look at the ssh processes.
  const std::string script =
      "\"$0\" env RANK LOCAL_RANK WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE CUDA_VISIBLE_DEVICES DDP_HSSH_DEFAULT "
      "NCCL_HSSH HSSH_X HSSH_XV HSSH_FROM_FILE HSSH_NOT_SENT DDPRUN_STORE_TOKEN && "
      "echo \"NET=$(readlink /proc/self/ns/net)\" && echo started && "
      "i=0 && while [ ! -e \"$1\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";
  const std::string include = h.address(2) + ":1,3@" + h.address(0) + ":0@" + h.address(1) + ":2,3";
  auto launcher = launch(h, file,
                         {"--include", include, "-x", "HSSH_X", "-x", "HSSH_XV=given value", "--env_file",
                          (h.dir() / "job.env").string()},
                         {"sh", "-c", script, e2e::kWorker, go},
                         {{"DDP_HSSH_DEFAULT", "d1"}, {"NCCL_HSSH", "n1"}, {"HSSH_X", "x1"}, {"HSSH_NOT_SENT", "no"}});
  const bool started = wait_all_ranks(*launcher, 5, "started");
  INFO(transcript(*launcher));  // (Catch builds the message here: after the wait)
  REQUIRE(started);
  auto ranks = e2e::by_rank(launcher->out());
  const std::string token = value_of(ranks[0], "DDPRUN_STORE_TOKEN");
  REQUIRE(token.size() >= 16);

  // The token is on no command line anywhere and not in the ssh clients' environment.
  const auto everything = h.job_processes();
  int ssh_clients = 0;
  const pid_t launcher_group = getpgid(launcher->pid());
  for (pid_t pid : everything) {
    INFO("process " << pid << ": " << proc_text(pid, "cmdline"));
    CHECK(proc_text(pid, "cmdline").find(token) == std::string::npos);
    if (command_name(pid) == "ssh" && SshHosts::net_namespace_of(pid) == h.net_namespace(h.hosts())) {
      ++ssh_clients;
      CHECK(proc_text(pid, "environ").find(token) == std::string::npos);
      CHECK(getpgid(pid) != launcher_group);  // the terminal's Ctrl-C reaches only the launcher
    }
  }
  CHECK(ssh_clients == 3);
  CHECK(launcher->out().find(token) != std::string::npos);  // (the workers did print it: the search is real)

  write_file(go, "");
  auto status = launcher->wait(60s);
  INFO("at the end:\n" << transcript(*launcher));
  REQUIRE(status.has_value());
  CHECK(*status == 0);

  ranks = e2e::by_rank(launcher->out());
  REQUIRE(ranks.size() == 5);
  // {host, node rank, local rank, CUDA_VISIBLE_DEVICES} of ranks 0..4.
  struct Expect {
    int host, node, local;
    std::string devices;
  };
  const Expect expect[5] = {{2, 0, 0, "1,3"}, {2, 0, 1, "1,3"}, {0, 1, 0, "0"}, {1, 2, 0, "2,3"}, {1, 2, 1, "2,3"}};
  for (int r = 0; r < 5; ++r) {
    const auto& l = ranks[r];
    INFO("rank " << r);
    CHECK(value_of(l, "NET") == "net:[" + std::to_string(h.net_namespace(expect[r].host)) + "]");
    CHECK(value_of(l, "RANK") == std::to_string(r));
    CHECK(value_of(l, "LOCAL_RANK") == std::to_string(expect[r].local));
    CHECK(value_of(l, "GROUP_RANK") == std::to_string(expect[r].node));
    CHECK(value_of(l, "WORLD_SIZE") == "5");
    CHECK(value_of(l, "GROUP_WORLD_SIZE") == "3");
    CHECK(value_of(l, "CUDA_VISIBLE_DEVICES") == expect[r].devices);
    CHECK(value_of(l, "DDP_HSSH_DEFAULT") == "d1");  // a default prefix
    CHECK(value_of(l, "NCCL_HSSH") == "n1");
    CHECK(value_of(l, "HSSH_X") == "x1");           // -x VAR
    CHECK(value_of(l, "HSSH_XV") == "given value");  // -x VAR=value
    CHECK(value_of(l, "HSSH_FROM_FILE") == "a=b c");
    CHECK(std::find(l.begin(), l.end(), "HSSH_NOT_SENT unset") != l.end());
    CHECK(value_of(l, "DDPRUN_STORE_TOKEN") == token);
  }
  check_nothing_left(h, 10s);
}

TEST_CASE("a worker failing on host 3 ends the job on every host with its status", "[hostfile]") {
  SshHosts h(3);
  const std::string file = write_hostfile(h, {{h.address(0), 2}, {h.address(1), 2}, {h.address(2), 2}});
  // Rank 5 (host 3's second worker) exits 3; every other rank would sleep for 10 minutes.
  auto launcher = launch(h, file, {}, {e2e::kWorker, "fail", "5", "3"});
  auto status = launcher->wait(60s);
  INFO(transcript(*launcher));
  REQUIRE(status.has_value());
  CHECK(*status == 3);
  CHECK_THAT(launcher->err(), Catch::Contains("rank 5") && Catch::Contains(h.address(2)));
  CHECK_THAT(launcher->err(), Catch::Contains("exited with code 3"));
  check_nothing_left(h, 10s);
}

TEST_CASE("Ctrl-C to the launcher stops every host's workers and agents", "[hostfile]") {
  SshHosts h(3);
  const std::string file = write_hostfile(h, {{h.address(0), 2}, {h.address(1), 2}, {h.address(2), 2}});
  // Workers that ignore SIGTERM: only the grace period's SIGKILL ends them.
  auto launcher = launch(h, file, {}, {e2e::kWorker, "ignore-term"});
  const bool ready = wait_all_ranks(*launcher, 6, "ready");
  INFO(transcript(*launcher));
  REQUIRE(ready);
  launcher->send_signal(SIGINT);
  // The benchmark's target is the grace period; the bound here leaves room for a busy machine.
  auto gone = h.wait_no_job_processes(std::chrono::seconds(kGrace + 7));
  INFO("left on the hosts:\n" << SshHosts::describe(h.job_processes()) << "at the end:\n" << transcript(*launcher));
  CHECK(gone.has_value());
  auto status = launcher->wait(5s);
  REQUIRE(status.has_value());
  CHECK(*status != 0);
}

TEST_CASE("a host that cannot be reached fails the launch within the connect timeout and names it", "[hostfile]") {
  SshHosts h(2);
  const std::string file = write_hostfile(h, {{h.address(0), 1}, {h.address(1), 1}, {h.unreachable_address(), 1}});
  // The user's ConnectTimeout comes before ddprun's default (ssh keeps the first).
  auto launcher = launch(h, file, {"--ssh_args", "-o ConnectTimeout=3"}, {e2e::kWorker, "trap", "15"});
  auto status = launcher->wait(15s);
  INFO(transcript(*launcher));
  REQUIRE(status.has_value());
  CHECK(*status != 0);
  CHECK(launcher->seconds_since_start() < 3 + 7);
  CHECK_THAT(launcher->err(), Catch::Contains(h.unreachable_address()));
  // ssh's own error (no ARP reply: the connect times out, or the route fails first).
  CHECK_THAT(launcher->err(), Catch::Contains("timed out") || Catch::Contains("No route to host"));
  check_nothing_left(h, 10s);  // the nodes already started were stopped
}

TEST_CASE("the launcher SIGKILLed: every host's agent and workers stop within the heartbeat timeout", "[hostfile]") {
  SshHosts h(3);
  const std::string file = write_hostfile(h, {{h.address(0), 2}, {h.address(1), 2}, {h.address(2), 2}});
  auto launcher = launch(h, file, {}, {e2e::kWorker, "trap", "15"});
  const bool ready = wait_all_ranks(*launcher, 6, "ready");
  INFO(transcript(*launcher));
  REQUIRE(ready);
  launcher->send_signal(SIGKILL);
  // Target: heartbeat timeout + 1 s (the benchmark's figure); asserted with room to spare.
  auto gone = h.wait_no_job_processes(std::chrono::seconds(kHeartbeat + 7));
  INFO("left on the hosts:\n" << SshHosts::describe(h.job_processes()) << "at the end:\n" << transcript(*launcher));
  CHECK(gone.has_value());
}

TEST_CASE("Fashion-MNIST trained over 3 ssh hosts reaches the target accuracy", "[hostfile]") {
  SshHosts h(3);
  const std::string file = write_hostfile(h, {{h.address(0), 1}, {h.address(1), 1}, {h.address(2), 1}});
  auto launcher = launch(h, file, {}, {kFashion, "--epochs", "6"}, {{"OMP_NUM_THREADS", "1"}});
  auto status = launcher->wait(170s);
  INFO(transcript(*launcher));
  REQUIRE(status.has_value());
  CHECK(*status == 0);
  const auto starts = fashion::starts(launcher->out());
  REQUIRE(starts.size() == 1);
  CHECK(starts[0].world == 3);
  const auto acc = fashion::final_accuracy(launcher->out());
  REQUIRE(acc.has_value());
  CHECK(*acc >= kTargetAccuracy);
  check_nothing_left(h, 10s);
}
