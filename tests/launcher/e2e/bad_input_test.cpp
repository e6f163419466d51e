// Bad input: one clear line on stderr, exit 2 for usage errors and 1 for launches
// that cannot start, and no worker started.
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "e2e.hpp"

using namespace testing;

namespace {

// Runs ddprun with `flags` in front of a worker that would create a marker file,
// and checks the refusal: status, a single stderr line containing `expect`, no worker.
void expect_refusal(const std::vector<std::string>& flags, int status, const std::string& expect,
                    std::vector<std::string> program = {}) {
  TempDir dir;
  auto marker = (dir / "started").string();
  std::vector<std::string> args = flags;
  if (program.empty()) program = {e2e::kWorker, "touch", marker};
  args.insert(args.end(), program.begin(), program.end());
  auto r = run(e2e::ddprun(args), {}, 30s);
  INFO("args: " << Catch::rangeToString(args) << "\nstderr: " << r.err);
  CHECK(r.status == status);
  auto lines = lines_of(r.err);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::StartsWith("ddprun: error: ") && Catch::Contains(expect));
  CHECK(r.out.empty());
  CHECK_FALSE(std::filesystem::exists(marker));
}

}  // namespace

TEST_CASE("invalid flag values are usage errors (exit 2)", "[e2e][bad_input]") {
  expect_refusal({"--nproc_per_node=0"}, 2, "--nproc_per_node");
  expect_refusal({"--nproc_per_node=lots"}, 2, "--nproc_per_node");
  expect_refusal({"--nnodes=2", "--standalone"}, 2, "single-node");
  expect_refusal({"--nnodes=1:2", "--standalone"}, 2, "elastic job");
  expect_refusal({"--nnodes=2:1"}, 2, "--nnodes");
  expect_refusal({"--rdzv_conf=join_timeout=soon"}, 2, "--rdzv_conf");
  expect_refusal({"--rdzv_conf=shard=3"}, 2, "unknown key 'shard'");
  expect_refusal({"--rdzv_endpoint=daemon:http"}, 2, "--rdzv_endpoint");
  expect_refusal({"--node_rank=3"}, 2, "--node_rank");
  expect_refusal({"--master_port=65536"}, 2, "--master_port");
  expect_refusal({"--redirects=7"}, 2, "--redirects");
  expect_refusal({"--tee=0:9"}, 2, "--tee");
  expect_refusal({"--nproc_per_node=2", "--redirects=5:1"}, 2, "local rank 5");
  expect_refusal({"--nproc_per_node=2", "--local_ranks_filter=2"}, 2, "--local_ranks_filter");
  expect_refusal({"--monitor_interval=-1"}, 2, "--monitor_interval");
  expect_refusal({"--grace_period=soon"}, 2, "--grace_period");
  expect_refusal({"--max_restarts=x"}, 2, "--max_restarts");
  expect_refusal({"--role="}, 2, "--role");
  expect_refusal({"--no-such-flag"}, 2, "--no-such-flag");
  expect_refusal({"-m", "--no_python"}, 2, "together");
}

TEST_CASE("a missing program is a usage error", "[e2e][bad_input]") {
  auto r = run(e2e::ddprun({"--nproc_per_node=2"}));
  CHECK(r.status == 2);
  REQUIRE(lines_of(r.err).size() == 1);
  CHECK_THAT(r.err, Catch::Contains("no program given"));
}

TEST_CASE("programs that cannot run are refused before any worker starts (exit 1)", "[e2e][bad_input]") {
  TempDir dir;
  expect_refusal({"--standalone"}, 1, "not found", {(dir / "nope").string()});
  expect_refusal({"--standalone"}, 1, "not found in PATH", {"no-such-program-ddprun"});
  expect_refusal({"--standalone"}, 1, "is a directory", {dir.path().string()});
  write_file(dir / "plain.sh", "#!/bin/sh\necho hi\n");
  expect_refusal({"--standalone"}, 1, "is not executable", {(dir / "plain.sh").string()});
  expect_refusal({"--standalone"}, 1, "cannot be read", {(dir / "missing.py").string()});
}

TEST_CASE("an unwritable log dir is refused (exit 1)", "[e2e][bad_input]") {
  TempDir dir;
  write_file(dir / "file", "not a directory");
  expect_refusal({"--standalone", "--log_dir", (dir / "file").string()}, 1, "cannot create log dir");
}

TEST_CASE("a master port in use is refused (exit 1)", "[e2e][bad_input]") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd, 1) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  std::string port = std::to_string(ntohs(addr.sin_port));
  expect_refusal({"--master_port=" + port}, 1, "master port " + port + " cannot be bound");
  close(fd);
}

TEST_CASE("the default master port held by another job: this one runs on a free port and says so",
          "[e2e][bad_input]") {
  // Hold 29500 on loopback as another one-node job's store would (a concurrent test may
  // hold it for a moment: wait for it, bounded).
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(29500);
  auto until = std::chrono::steady_clock::now() + 60s;
  while (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    REQUIRE(std::chrono::steady_clock::now() < until);
    std::this_thread::sleep_for(100ms);
  }
  REQUIRE(listen(fd, 1) == 0);
  auto r = run(e2e::ddprun({"--nproc_per_node=1", "/bin/sh", "-c", "echo port=$MASTER_PORT"}), {}, 30s);
  close(fd);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("the default master port 29500 is taken"));
  const auto at = r.out.find("port=");
  REQUIRE(at != std::string::npos);
  const int port = std::stoi(r.out.substr(at + 5));
  CHECK(port != 29500);
  CHECK(port > 0);
}

TEST_CASE("nproc_per_node=gpu without a usable GPU is refused (exit 1)", "[e2e][bad_input]") {
  // CUDA_VISIBLE_DEVICES="" hides every GPU, so this holds on GPU machines too.
  TempDir dir;
  auto marker = (dir / "started").string();
  auto r = run(e2e::ddprun({"--nproc_per_node=gpu", e2e::kWorker, "touch", marker}),
               {{{"CUDA_VISIBLE_DEVICES", ""}}, {}});
  CHECK(r.status == 1);
  REQUIRE(lines_of(r.err).size() == 1);
  CHECK_THAT(r.err, Catch::Contains("--nproc_per_node=gpu"));
  CHECK_FALSE(std::filesystem::exists(marker));
}

TEST_CASE("a program that passes the checks but cannot be executed fails like a shell would", "[e2e][bad_input]") {
  TempDir dir;
  write_file(dir / "garbage", "\x7f" "ELF-but-not-really", true);
  auto r = run(e2e::ddprun({"--standalone", (dir / "garbage").string()}));
  CHECK(r.status == 126);
  CHECK_THAT(r.err, Catch::Contains("[rank0]:ddprun: cannot execute"));
  CHECK_THAT(r.err, Catch::Contains("Root cause"));
}

TEST_CASE("a bad host list or remote flag is refused before any host is contacted", "[e2e][bad_input]") {
  TempDir dir;
  write_file(dir / "twice", "localhost slots=1\n# again:\nlocalhost slots=2\n");
  expect_refusal({"--hostfile", (dir / "twice").string()}, 2, (dir / "twice").string() + ":3: host 'localhost' is given twice");
  write_file(dir / "typo", "localhost slot=2\n");
  expect_refusal({"--hostfile", (dir / "typo").string()}, 2, "unknown token 'slot=2'");
  expect_refusal({"--hostfile", (dir / "missing").string()}, 1, "cannot read --hostfile");
  expect_refusal({"--hosts", "localhost:2", "--include", "otherhost"}, 2, "'otherhost' is not in the host list");
  expect_refusal({"--hosts", "localhost:2", "--include", "localhost:2"}, 2, "GPU index 2");
  expect_refusal({"--hosts", "localhost", "--node_rank=0"}, 2, "node ranks follow the host list's order");
  expect_refusal({"--hosts", "localhost", "--hostfile", (dir / "typo").string()}, 2, "cannot be used together");
  expect_refusal({"-x", "A=1"}, 2, "-x needs --hostfile or --hosts");
}

TEST_CASE("help and version exit 0", "[e2e][bad_input]") {
  auto h = run(e2e::ddprun({"--help"}));
  CHECK(h.status == 0);
  CHECK_THAT(h.out, Catch::Contains("Usage: ddprun [options] PROGRAM [ARGS...]"));
  CHECK_THAT(h.out, Catch::Contains("--nproc_per_node,--nproc-per-node"));
  CHECK_THAT(h.out, Catch::Contains("a node lost or leaving uses one restart; a node joining uses none"));
  CHECK_THAT(h.out, Catch::Contains("--hostfile FILE") && Catch::Contains("ddprun --hostfile FILE [options] PROGRAM"));
  auto v = run(e2e::ddprun({"--version"}));
  CHECK(v.status == 0);
  CHECK_THAT(v.out, Catch::StartsWith("ddprun "));
}

TEST_CASE("torchrun's rdzv_conf keys without effect are named at start and the job runs", "[e2e][bad_input]") {
  auto r = run(e2e::ddprun({"--standalone", "--rdzv_conf=close_timeout=5,keep_alive_interval=2", e2e::kWorker, "env",
                            "RANK"}),
               {}, 30s);
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("ddprun: info: --rdzv_conf close_timeout has no effect: ") &&
                        Catch::Contains("ddprun: info: --rdzv_conf keep_alive_interval has no effect: "));
  CHECK_THAT(r.out, Catch::Contains("RANK=0"));
}
