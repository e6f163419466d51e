// Flag defaults from PET_* variables, as torchrun reads them (Kubernetes operators set
// them): the variable names, on/off flags as integers, precedence over Slurm and under
// the command line, and errors that name the variable.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include <CLI/CLI.hpp>

#include "cli/env_defaults.hpp"
#include "command_line.hpp"
#include "scoped_env.hpp"

using command_line::flags_error;
using command_line::parse_flags;
using testing::ScopedEnv;

namespace {

void set_all(ScopedEnv& env, const std::map<std::string, std::string>& vars) {
  for (const auto& [name, value] : vars) env.set(name, value);
}

bool has_note(const ddprun::LaunchOptions& o, const std::string& note) {
  return std::find(o.value_notes.begin(), o.value_notes.end(), note) != o.value_notes.end();
}

}  // namespace

TEST_CASE("PET_ + the first long spelling in upper case names each flag's variable", "[options][pet]") {
  CHECK(ddprun::env_default_variable("nproc_per_node") == "PET_NPROC_PER_NODE");
  CHECK(ddprun::env_default_variable("nproc-per-node") == "PET_NPROC_PER_NODE");
  CHECK(ddprun::env_default_variable("rdzv_endpoint") == "PET_RDZV_ENDPOINT");
}

TEST_CASE("torchrun's PET_* variables set ddprun's flags", "[options][pet]") {
  ScopedEnv env;
  set_all(env, {{"PET_NNODES", "2"},           {"PET_NPROC_PER_NODE", "3"},
                {"PET_NODE_RANK", "1"},        {"PET_MASTER_ADDR", "node0.job"},
                {"PET_MASTER_PORT", "23456"},  {"PET_RDZV_BACKEND", "c10d"},
                {"PET_RDZV_ID", "job-7"},      {"PET_RDZV_CONF", "join_timeout=45"},
                {"PET_MAX_RESTARTS", "3"},     {"PET_MONITOR_INTERVAL", "1.5"},
                {"PET_ROLE", "trainer"},       {"PET_LOG_DIR", "/tmp/pet-logs"},
                {"PET_REDIRECTS", "3"},        {"PET_TEE", "1"},
                {"PET_LOCAL_RANKS_FILTER", "0,2"}, {"PET_LOCAL_ADDR", "10.0.0.2"},
                {"PET_MODULE", "1"}});
  const auto o = parse_flags({});
  CHECK(o.nnodes == 2);
  CHECK(o.nproc_per_node == "3");
  CHECK(o.nproc_per_node_given);  // a PET value counts as given (it beats a host list's slots)
  CHECK(o.node_rank == 1);
  CHECK(o.master_addr == "node0.job");
  CHECK(o.master_addr_given);
  CHECK(o.master_port == 23456);
  CHECK(o.run_id == "job-7");
  CHECK(o.join_timeout == 45);
  CHECK(o.max_restarts == 3);
  CHECK(o.monitor_interval == 1.5);
  CHECK(o.role == "trainer");
  CHECK(o.log_dir == "/tmp/pet-logs");
  CHECK(o.redirects.text() == "3");
  CHECK(o.tee.text() == "1");
  CHECK(o.local_ranks_filter == std::set<int>{0, 2});
  CHECK(o.local_addr == "10.0.0.2");
  CHECK(o.module);
  CHECK(has_note(o, "--nnodes=2 from PET_NNODES"));
  CHECK(has_note(o, "--module from PET_MODULE='1'"));
}

TEST_CASE("ddprun's own flags read PET_* by the same rule", "[options][pet]") {
  ScopedEnv env;
  set_all(env, {{"PET_STALL_TIMEOUT", "12"},     {"PET_STALL_ACTION", "stop"},
                {"PET_GRACE_PERIOD", "4"},       {"PET_JOIN_TIMEOUT", "50"},
                {"PET_HEARTBEAT_TIMEOUT", "7"},  {"PET_EXIT_BARRIER_TIMEOUT", "8"},
                {"PET_VERBOSE", "1"},
                {"PET_RDZV_CONF", "join_timeout=45"}});  // --join_timeout (from PET_JOIN_TIMEOUT) wins over it
  const auto o = parse_flags({});
  CHECK(o.stall_timeout == 12);
  CHECK(o.stall_stop);
  CHECK(o.grace_period == 4);
  CHECK(o.join_timeout == 50);
  CHECK(o.heartbeat_timeout == 7);
  CHECK(o.exit_barrier_timeout == 8);
  CHECK(o.verbose);
}

TEST_CASE("a host list from PET_HOSTS launches, as --hosts does", "[options][pet]") {
  ScopedEnv env;
  env.set("PET_HOSTS", "h1:2,h2:2");
  const auto o = parse_flags({});
  CHECK(o.remote.hosts == "h1:2,h2:2");
  CHECK(o.remote.launching());
}

TEST_CASE("the command line beats PET_*, and -v's notes say so", "[options][pet]") {
  ScopedEnv env;
  env.set("PET_NPROC_PER_NODE", "4");
  env.set("PET_NNODES", "2");
  env.set("PET_NODE_RANK", "1");
  const auto o = parse_flags({"--nproc-per-node=2", "--nnodes", "1", "--node_rank=0"});
  CHECK(o.nproc_per_node == "2");
  CHECK(o.nnodes == 1);
  CHECK(o.node_rank == 0);
  CHECK(has_note(o, "--nproc_per_node=2 from the command line"));
  CHECK(has_note(o, "PET_NPROC_PER_NODE='4' not used: --nproc_per_node is on the command line"));
}

TEST_CASE("on/off flags read PET_* as an integer, as torchrun's check_env does", "[options][pet]") {
  ScopedEnv env;
  for (const char* on : {"1", "2", "-1", "+1", " 1 ", "01"}) {
    env.set("PET_STANDALONE", on);
    INFO(on);
    CHECK(parse_flags({}).standalone);
  }
  for (const char* off : {"0", "00", " -0"}) {
    env.set("PET_STANDALONE", off);
    INFO(off);
    const auto o = parse_flags({});
    CHECK_FALSE(o.standalone);
    CHECK(has_note(o, std::string("PET_STANDALONE='") + off + "': --standalone off"));
  }
  env.set("PET_STANDALONE", "0");
  CHECK(parse_flags({"--standalone"}).standalone);  // the flag on the command line turns it on
  // torchrun fails with a Python traceback on these; ddprun with one line.
  for (const char* bad : {"true", "yes", "", "1.0", "1_0"}) {
    env.set("PET_STANDALONE", bad);
    INFO(bad);
    CHECK(flags_error({}) == std::string("invalid PET_STANDALONE '") + bad +
                                 "' (from the environment, for --standalone): expected an integer: 0 for off, "
                                 "any other for on");
  }
}

TEST_CASE("a bad PET_* value gets the flag's error, naming the variable", "[options][pet]") {
  ScopedEnv env;
  env.set("PET_NNODES", "0");
  CHECK(flags_error({}) ==
        "invalid PET_NNODES '0' (from the environment, for --nnodes): expected a positive node count N, or "
        "MIN:MAX with 1 <= MIN <= MAX");
  env.set("PET_NNODES", std::nullopt);
  env.set("PET_MASTER_PORT", "http");
  CHECK(flags_error({}) == "invalid PET_MASTER_PORT 'http' (from the environment, for --master_port): expected a "
                           "port in 1-65535");
  env.set("PET_MASTER_PORT", std::nullopt);
  env.set("PET_RDZV_CONF", "rdzv_timeout=3");
  CHECK_THAT(flags_error({}), Catch::StartsWith("invalid PET_RDZV_CONF 'rdzv_timeout=3' (from the environment, "
                                                "for --rdzv_conf): unknown key 'rdzv_timeout'"));
  env.set("PET_RDZV_CONF", std::nullopt);
  // A check across flags: the node rank from the command line, the count from PET_NNODES.
  env.set("PET_NNODES", "2");
  CHECK(flags_error({"--node_rank=2"}) ==
        "invalid --node_rank '2': expected a node rank in [0, nnodes) with nnodes=2");
  env.set("PET_NODE_RANK", "2");
  CHECK(flags_error({}) == "invalid PET_NODE_RANK '2' (from the environment, for --node_rank): expected a node "
                           "rank in [0, nnodes) with nnodes=2");
}

TEST_CASE("an empty PET_* is the default where that is empty, else refused", "[options][pet]") {
  ScopedEnv env;
  env.set("PET_RDZV_CONF", "");
  env.set("PET_RDZV_ENDPOINT", "");
  env.set("PET_LOG_DIR", "");
  const auto o = parse_flags({});
  CHECK_FALSE(o.rdzv_host);
  CHECK_FALSE(o.log_dir);
  env.set("PET_NODE_RANK", "");
  CHECK(flags_error({}) == "invalid PET_NODE_RANK '' (from the environment, for --node_rank): empty; unset it or "
                           "give a value (default 0)");
}

TEST_CASE("a refusal about a flag set by PET_* names the variable", "[options][pet]") {
  ScopedEnv env;
  env.set("PET_NNODES", "2");
  CHECK(flags_error({"--hosts", "a,b"}) ==
        "--nnodes cannot be used with --hosts: the host list is the job's nodes (pick some with --include/--exclude) "
        "(from the environment: --nnodes is PET_NNODES=2)");
  env.set("PET_NNODES", std::nullopt);
  env.set("PET_MODULE", "1");
  env.set("PET_NO_PYTHON", "1");
  CHECK(flags_error({}) == "--module and --no_python cannot be used together (from the environment: --no_python is "
                           "PET_NO_PYTHON=1, --module is PET_MODULE=1)");
}

TEST_CASE("only the first long spelling names a variable, and hidden flags have none", "[options][pet]") {
  ScopedEnv env;
  env.set("PET_RUN_ID", "x");           // --run_id is a second spelling of --rdzv_id
  env.set("PET_NPROC-PER-NODE", "3");   // not a name torchrun reads either
  env.set("PET_AGENT_STDIN", "1");      // --agent_stdin is hidden: a launching ddprun passes it
  env.set("PET_HELP", "1");
  env.set("PET_VERSION", "1");
  const auto o = parse_flags({});
  CHECK(o.run_id.empty());
  CHECK(o.nproc_per_node == "1");
  CHECK_FALSE(o.remote.agent_stdin);
}

TEST_CASE("an agent started by a launching ddprun reads no PET_*", "[options][pet]") {
  ScopedEnv env;
  env.set("PET_NODE_RANK", "5");
  env.set("PET_HOSTS", "h1,h2");  // its launcher's own setting, inherited by a local agent
  env.set("PET_RDZV_CONF", "bogus=1");
  const auto o = parse_flags({"--nnodes=2", "--node_rank=1", "--agent_stdin"});
  CHECK(o.node_rank == 1);
  CHECK_FALSE(o.remote.launching());
  CHECK(o.value_notes.empty());
}

TEST_CASE("PET_* beats a Slurm step's variables, and Slurm fills the rest", "[options][pet]") {
  ScopedEnv env;
  set_all(env, {{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NNODES", "2"}, {"SLURM_STEP_NUM_NODES", "2"},
                {"SLURM_NODEID", "1"}, {"SLURM_STEP_NODELIST", "n[0-1]"}, {"SLURM_JOB_NODELIST", "n[0-1]"},
                {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}});
  set_all(env, {{"PET_NNODES", "3"}, {"PET_NODE_RANK", "2"}, {"PET_MASTER_ADDR", "pod-0"}});
  const auto o = parse_flags({});
  CHECK(o.nnodes == 3);
  CHECK(o.node_rank == 2);
  CHECK(o.master_addr == "pod-0");
  CHECK(o.run_id == "slurm-77.0");  // not given by PET_*: Slurm's
  CHECK(o.slurm_notes.size() == 2);  // the port and the run id
}

TEST_CASE("an option added to the command line later gets its PET_* with no more code", "[options][pet]") {
  // As a new flag would be added to ddprun's CLI11 app: only its name says which variable.
  CLI::App app{"later"};
  std::string seconds;
  bool virtual_rank = false;
  app.add_option("--shutdown_timeout,--shutdown-timeout", seconds)->check(CLI::Range(0, 3600));
  app.add_flag("--virtual_local_rank,--virtual-local-rank", virtual_rank);
  const char* argv[] = {"later"};
  app.parse(1, const_cast<char**>(argv));
  ScopedEnv env;
  env.set("PET_SHUTDOWN_TIMEOUT", "12");
  env.set("PET_VIRTUAL_LOCAL_RANK", "1");
  const auto sources = ddprun::EnvDefaults::apply(app);
  CHECK(seconds == "12");
  CHECK(virtual_rank);
  CHECK(app.count("--shutdown_timeout") == 1);  // counts as given
  CHECK(sources.notes() == std::vector<std::string>{"--shutdown_timeout=12 from PET_SHUTDOWN_TIMEOUT",
                                                    "--virtual_local_rank from PET_VIRTUAL_LOCAL_RANK='1'"});
  // The option's own check refuses a value: the message names the variable.
  CLI::App again{"later"};
  again.add_option("--shutdown_timeout", seconds)->check(CLI::Range(0, 3600));
  again.parse(1, const_cast<char**>(argv));
  env.set("PET_SHUTDOWN_TIMEOUT", "7200");
  try {
    ddprun::EnvDefaults::apply(again);
    FAIL("expected a UsageError");
  } catch (const ddprun::UsageError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("invalid PET_SHUTDOWN_TIMEOUT '7200' (from the environment, for "
                                           "--shutdown_timeout): "));
  }
}
