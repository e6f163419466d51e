// torchrun 2.x's newer flags through the real ddprun and real workers: NUMA binding
// on a made-up topology, virtual local rank, line prefixes, filtered log copies, the
// handled signals, the shutdown timeout, --run_path, xpu, and the accepted flags.
#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "e2e.hpp"
#include "numa_topology.hpp"

using namespace testing;

namespace {

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

bool has_line(const std::string& text, const std::string& line) {
  auto lines = lines_of(text);
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

// Two single-CPU nodes on two sockets: CPU 0 on node 0, CPU 1 on node 1.
void write_two_single_cpu_nodes(const TempDir& sys) {
  TopologyShape shape;
  shape.nodes_per_socket = 1;
  shape.cores_per_node = 1;
  shape.threads_per_core = 1;
  shape.l3_per_node = 1;
  write_topology(sys.path(), shape);
}

// A made-up topology: its PCI tree has no GPUs, so this machine's are hidden too.
ProcessOptions no_gpus(const TempDir& sys) {
  return {{{"DDPRUN_SYSFS_ROOT", sys.path().string()}, {"CUDA_VISIBLE_DEVICES", ""}}, {}};
}

}  // namespace

TEST_CASE("numa binding binds each worker to its node's CPUs of a made-up topology", "[e2e][torchrun][numa]") {
  // Two single-CPU nodes on two sockets: CPU 0 on node 0, CPU 1 on node 1 (this machine's two CPUs).
  TempDir sys;
  write_two_single_cpu_nodes(sys);
  for (std::string mode : {"node", "exclusive", "core-complex"}) {
    INFO("--numa-binding=" << mode);
    auto r = run(e2e::ddprun({"-v", "--nproc_per_node=2", "--standalone", "--numa-binding=" + mode, "sh", "-c",
                              "grep Cpus_allowed_list /proc/self/status; grep -c ' prefer:0 ' /proc/self/numa_maps || true"}),
                 no_gpus(sys));
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.err, !Catch::Contains("cannot list the GPUs"));
    auto ranks = e2e::by_rank(r.out);
    REQUIRE(ranks[0].size() == 2);
    REQUIRE(ranks[1].size() == 2);
    CHECK(ranks[0][0] == "Cpus_allowed_list:\t0");
    CHECK(ranks[1][0] == "Cpus_allowed_list:\t1");
    CHECK(ranks[0][1] != "0");  // rank 0 prefers node 0's memory (node 1 is not on this machine: not applied)
    CHECK_THAT(r.err, Catch::Contains("--numa_binding=" + mode + ": local rank 0 (no GPU): CPUs 0, memory node 0"));
    CHECK_THAT(r.err, Catch::Contains("--numa_binding=" + mode + ": local rank 1 (no GPU): CPUs 1, memory node 1"));
  }
  // socket: both nodes' sockets differ, so the same CPUs as node.
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--numa_binding=socket", "grep",
                            "Cpus_allowed_list", "/proc/self/status"}),
               no_gpus(sys));
  REQUIRE(r.status == 0);
  CHECK(has_line(r.out, "[rank0]:Cpus_allowed_list:\t0"));
  CHECK(has_line(r.out, "[rank1]:Cpus_allowed_list:\t1"));
}

TEST_CASE("numa binding with a CUDA driver that fails says so and binds as without GPUs", "[e2e][torchrun][numa]") {
  TempDir sys;
  write_two_single_cpu_nodes(sys);
  const std::string driver_dir = std::filesystem::path(FAKE_CUDA_DRIVER).parent_path().string();
  auto r = run(e2e::ddprun({"-v", "--nproc_per_node=2", "--standalone", "--numa-binding=node", "true"}),
               {{{"DDPRUN_SYSFS_ROOT", sys.path().string()}, {"LD_LIBRARY_PATH", driver_dir}}, {}});
  INFO(r.err);
  CHECK(r.status == 0);
  auto lines = lines_of(r.err);
  CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
          return l.find("--numa_binding: cannot list the GPUs (cuInit failed with CUDA error 999); workers are bound "
                        "as on a machine without GPUs") != std::string::npos;
        }) == 1);
  CHECK_THAT(r.err, Catch::Contains("--numa_binding=node: local rank 1 (no GPU): CPUs 1, memory node 1"));
}

TEST_CASE("numa binding on a topology without usable CPUs stops before any worker starts", "[e2e][torchrun][numa]") {
  TempDir sys;
  write_text(sys / "devices/system/node/node0/cpulist", "900-901");
  auto r = run(e2e::ddprun({"--numa-binding=node", "--standalone", "true"}), no_gpus(sys));
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("--numa_binding: no NUMA node has a CPU this process may run on (allowed: "));
}

TEST_CASE("virtual local rank: LOCAL_RANK=0 and one GPU of ddprun's list per worker", "[e2e][torchrun]") {
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--virtual-local-rank", "sh", "-c",
                            "echo L=$LOCAL_RANK C=$CUDA_VISIBLE_DEVICES R=$RANK"}),
               {{{"CUDA_VISIBLE_DEVICES", "5,7"}}, {"HIP_VISIBLE_DEVICES"}});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(has_line(r.out, "[rank0]:L=0 C=5 R=0"));
  CHECK(has_line(r.out, "[rank1]:L=0 C=7 R=1"));
  auto none = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--virtual_local_rank", "sh", "-c",
                               "echo L=$LOCAL_RANK C=$CUDA_VISIBLE_DEVICES"}),
                  {{}, {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}});
  CHECK(has_line(none.out, "[rank1]:L=0 C=1"));
  auto few = run(e2e::ddprun({"--nproc_per_node=3", "--standalone", "--virtual-local-rank", "true"}),
                 {{{"CUDA_VISIBLE_DEVICES", "5,7"}}, {"HIP_VISIBLE_DEVICES"}});
  CHECK(few.status == 1);
  CHECK_THAT(few.err, Catch::Contains("--virtual_local_rank: local rank 2 has no GPU in CUDA_VISIBLE_DEVICES=5,7"));
}

TEST_CASE("a log line prefix template replaces the rank prefix with torchrun's fields and the host name",
          "[e2e][torchrun][prefix]") {
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--role=trainer", "--log-line-prefix-template",
                            "${hostname}:${rank}:${role_name}${local_rank}| ", "echo", "hi"}));
  REQUIRE(r.status == 0);
  CHECK(has_line(r.out, host_name() + ":0:trainer0| hi"));
  CHECK(has_line(r.out, host_name() + ":1:trainer1| hi"));
  // The variable, when the flag is not given; the flag wins over it.
  ProcessOptions env{{{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "<${local_rank}>"}}, {}};
  auto from_env = run(e2e::ddprun({"--standalone", "echo", "[rank0]:hi"}), env);
  CHECK(has_line(from_env.out, "<0>[rank0]:hi"));  // a template's prefix goes on every line
  auto flag_wins = run(e2e::ddprun({"--standalone", "--log_line_prefix_template=@ ", "echo", "hi"}), env);
  CHECK(has_line(flag_wins.out, "@ hi"));
}

TEST_CASE("duplicate filters copy matching lines of every rank to the attempt's filtered logs",
          "[e2e][torchrun][duplicate]") {
  TempDir logs;
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--rdzv_id=dup", "--log_dir", logs.path().string(),
                            "--duplicate-stdout-filters", "loss,,x,NCCL", "--duplicate_stderr_filters=WARN", "sh", "-c",
                            "echo step loss,x=1; echo noise; echo NCCL INFO; echo WARN low >&2; echo quiet >&2"}));
  REQUIRE(r.status == 0);
  auto out = lines_of(read_file(logs / "dup/attempt_0/filtered_stdout.log"));
  std::sort(out.begin(), out.end());
  CHECK(out == std::vector<std::string>{"[rank0]:NCCL INFO", "[rank0]:step loss,x=1", "[rank1]:NCCL INFO",
                                        "[rank1]:step loss,x=1"});
  auto err = lines_of(read_file(logs / "dup/attempt_0/filtered_stderr.log"));
  std::sort(err.begin(), err.end());
  CHECK(err == std::vector<std::string>{"[rank0]:WARN low", "[rank1]:WARN low"});
  CHECK(has_line(r.out, "[rank0]:noise"));  // the console still has every line
}

TEST_CASE("signals to handle: a listed SIGUSR1 goes to the workers and stops the job", "[e2e][torchrun][signals]") {
  Process p(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--signals-to-handle", "SIGTERM,SIGUSR1", e2e::kWorker,
                         "trap", std::to_string(SIGUSR1)}));
  REQUIRE(p.wait_for_stdout([](const std::string& out) { return e2e::all_ranks_said(out, 2, "ready"); }, 20s));
  p.send_signal(SIGUSR1);
  auto status = p.wait(20s);
  INFO(p.err());
  REQUIRE(status.has_value());
  CHECK(*status == 128 + SIGUSR1);
  CHECK(e2e::all_ranks_said(p.out(), 2, "got SIGUSR1"));
  auto env = run(e2e::ddprun({"--standalone", "--signals_to_handle=SIGINT,SIGUSR2", "sh", "-c",
                              "echo $TORCHELASTIC_SIGNALS_TO_HANDLE"}));
  CHECK(has_line(env.out, "[rank0]:SIGINT,SIGUSR2"));
  auto defaults = run(e2e::ddprun({"--standalone", "sh", "-c", "echo $TORCHELASTIC_SIGNALS_TO_HANDLE"}));
  CHECK(has_line(defaults.out, "[rank0]:SIGTERM,SIGINT,SIGHUP,SIGQUIT"));
}

TEST_CASE("the shutdown timeout from the flag or TORCH_ELASTIC_SHUTDOWN_TIMEOUT sets the grace period", "[e2e][torchrun][signals]") {
  for (bool from_env : {false, true}) {
    INFO((from_env ? "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1" : "--shutdown-timeout 1"));
    std::vector<std::string> args = {"--nproc_per_node=2", "--standalone"};
    if (!from_env) args.insert(args.end(), {"--shutdown-timeout", "1"});
    args.insert(args.end(), {e2e::kWorker, "ignore-term"});
    ProcessOptions env;
    if (from_env) env.set_env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "1";
    Process p(e2e::ddprun(args), env);
    REQUIRE(p.wait_for_stdout([](const std::string& out) { return e2e::all_ranks_said(out, 2, "ready"); }, 20s));
    auto ended = e2e::signal_and_wait(p, SIGTERM, 20s);
    REQUIRE(ended.status.has_value());
    CHECK(*ended.status == 128 + SIGTERM);
    CHECK(ended.seconds < 10);  // 1 s, not the default 30
    CHECK_THAT(p.err(), Catch::Contains("SIGKILL after 1 s"));
  }
}

TEST_CASE("run_path runs the script with runpy.run_path as __main__ and wins over no_python",
          "[e2e][torchrun][python]") {
  TempDir dir;
  write_file(dir / "train.py", "import sys\nprint(__name__, sys.argv, __file__ == sys.argv[0])\n");
  const std::string script = (dir / "train.py").string();
  for (const char* extra : {"--run-path", "--no-python"}) {
    std::vector<std::string> args = {"--standalone", "--run_path"};
    if (std::string(extra) != "--run-path") args.push_back(extra);
    args.insert(args.end(), {script, "a", "--b"});
    auto r = run(e2e::ddprun(args), {{{"PYTHON_EXEC", "/usr/bin/python3"}}, {}});
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(has_line(r.out, "[rank0]:__main__ ['" + script + "', 'a', '--b'] True"));
  }
}

TEST_CASE("nproc_per_node=xpu counts Intel XPUs or says why it cannot", "[e2e][torchrun]") {
  auto r = run(e2e::ddprun({"--nproc-per-node", "xpu", "--standalone", "true"}));
  if (r.status == 0) SUCCEED("an XPU is present");  // a machine with Level Zero and an Intel GPU
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("--nproc_per_node=xpu: "));
}

TEST_CASE("start_method and event_log_handler and logs_specs each say why they change nothing",
          "[e2e][torchrun]") {
  auto r = run(e2e::ddprun({"--standalone", "--start-method=fork", "--event_log_handler", "console", "--logs-specs",
                            "custom", "echo", "ran"}));
  REQUIRE(r.status == 0);
  CHECK(has_line(r.out, "[rank0]:ran"));
  for (const char* flag : {"--start_method fork has no effect: ", "--event_log_handler console has no effect: ",
                           "--logs_specs custom has no effect: "}) {
    CHECK_THAT(r.err, Catch::Contains(std::string("ddprun: info: ") + flag));
  }
}

TEST_CASE("a bad value of a newer flag exits 2 with one line naming the flag", "[e2e][torchrun][bad-input]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--numa-binding=numa"}, "invalid --numa_binding 'numa'"},
      {{"--signals-to-handle", "SIGSEGV"}, "invalid --signals_to_handle 'SIGSEGV'"},
      {{"--shutdown-timeout", "soon"}, "invalid --shutdown_timeout 'soon'"},
      {{"--start-method", "thread"}, "invalid --start_method 'thread'"},
      {{"--event-log-handler", "file"}, "invalid --event_log_handler 'file'"},
  };
  for (const auto& [flags, message] : cases) {
    auto args = flags;
    args.push_back("true");
    auto r = run(e2e::ddprun(args));
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(lines_of(r.err).size() == 1);
    CHECK_THAT(r.err, Catch::StartsWith("ddprun: error: " + message));
  }
}
