// Command-line parsing: torchrun's flags in both spellings, and one clear
// UsageError for each kind of bad value.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <map>

#include "command_line.hpp"
#include "errors.hpp"
#include "cli/options.hpp"
#include "scoped_env.hpp"

using ddprun::LaunchOptions;
using ddprun::UsageError;

using command_line::parse;
using command_line::usage_error;

TEST_CASE("both spellings of torchrun's flags are accepted", "[options]") {
  auto a = parse({"--nproc_per_node=3", "--master_port", "1234", "--no_python", "prog"});
  auto b = parse({"--nproc-per-node", "3", "--master-port=1234", "--no-python", "prog"});
  CHECK(a.nproc_per_node == "3");
  CHECK(b.nproc_per_node == "3");
  CHECK(a.master_port == 1234);
  CHECK(b.master_port == 1234);
  CHECK(a.no_python);
  CHECK(b.no_python);
}

TEST_CASE("everything after the program belongs to the program", "[options]") {
  auto o = parse({"--nproc_per_node=2", "train.py", "--nproc_per_node=7", "-m", "--lr", "0.1"});
  CHECK(o.program == "train.py");
  CHECK(o.program_args == std::vector<std::string>{"--nproc_per_node=7", "-m", "--lr", "0.1"});
  CHECK(o.nproc_per_node == "2");
  CHECK_FALSE(o.module);
}

TEST_CASE("defaults match torchrun's", "[options]") {
  auto o = parse({"prog"});
  CHECK(o.nproc_per_node == "1");
  CHECK(o.nnodes == 1);
  CHECK(o.node_rank == 0);
  CHECK(o.master_addr == "127.0.0.1");
  CHECK_FALSE(o.master_port.has_value());
  CHECK(o.role == "default");
  CHECK(o.max_restarts == 0);
  CHECK(o.grace_period == 30.0);
  CHECK_FALSE(o.redirects.any());
}

TEST_CASE("torchrun's rendezvous flags are understood", "[options]") {
  auto daemon = parse({"--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:29400",
                       "--rdzv_id=job7", "p"});
  CHECK(daemon.nnodes == 2);
  CHECK(daemon.node_rank == 1);
  CHECK(*daemon.rdzv_host == "::1");
  CHECK(daemon.rdzv_port == 29400);
  // torchrun's single-node recipe: a free port, no daemon.
  auto local = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "p"});
  CHECK(local.standalone);
  CHECK_FALSE(local.rdzv_host.has_value());
  CHECK(parse({"--", "prog", "x"}).program == "prog");
}

TEST_CASE("an endpoint means torchrun's c10d: port 29400, run id none, ranks by arrival", "[options]") {
  // PyTorch's multi-node recipe, unchanged.
  auto recipe = parse({"--nnodes=2", "--nproc_per_node=2", "--rdzv_id=100", "--rdzv_backend=c10d",
                       "--rdzv_endpoint=10.250.0.1:29400", "p"});
  CHECK(*recipe.rdzv_host == "10.250.0.1");
  CHECK(recipe.rdzv_port == 29400);
  CHECK(recipe.run_id == "100");
  CHECK_FALSE(recipe.run_id_defaulted);
  CHECK(recipe.ranks_by_arrival);  // no --node_rank: torchrun assigns ranks by arrival
  CHECK(recipe.elastic_rounds());
  CHECK_FALSE(recipe.elastic());
  CHECK_FALSE(recipe.rdzv_is_host.has_value());

  auto bare = parse({"--nnodes=2", "--rdzv_endpoint=node0", "p"});
  CHECK(*bare.rdzv_host == "node0");
  CHECK(bare.rdzv_port == 29400);
  CHECK(bare.run_id == "none");
  CHECK(bare.run_id_defaulted);
  auto v6 = parse({"--rdzv_endpoint=[fe80::1]", "p"});
  CHECK(*v6.rdzv_host == "fe80::1");
  CHECK(v6.rdzv_port == 29400);
  CHECK(parse({"--rdzv_endpoint=[::1]:5000", "p"}).rdzv_port == 5000);

  // An explicit rank keeps the fixed join; elastic jobs and one node need no arrival order.
  CHECK_FALSE(parse({"--nnodes=2", "--node_rank=1", "--rdzv_endpoint=h", "p"}).ranks_by_arrival);
  CHECK_FALSE(
      parse({"--nnodes=2", "--node_rank=1", "--rdzv_backend=static", "--rdzv_endpoint=h", "p"}).ranks_by_arrival);
  // ... but torchrun's c10d backend ignores --node_rank, saying so: ranks by arrival, the rank an order hint.
  auto c10d = parse({"--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d", "--rdzv_endpoint=h", "p"});
  CHECK(c10d.ranks_by_arrival);
  CHECK(c10d.node_rank_given);
  REQUIRE(c10d.torchrun_notes.size() == 1);
  CHECK_THAT(c10d.torchrun_notes[0], Catch::StartsWith("node_rank is only used for static rdzv_backend"));
  CHECK(parse({"--nnodes=2", "--node_rank=0", "--rdzv_backend=c10d", "--rdzv_endpoint=h", "p"}).torchrun_notes.empty());
  auto beyond = parse({"--nnodes=2", "--node_rank=5", "--rdzv_backend=c10d", "--rdzv_endpoint=h", "p"});
  CHECK(beyond.ranks_by_arrival);  // ignored rather than refused, as torchrun
  CHECK_FALSE(beyond.node_rank_given);
  // Without an endpoint the backend changes nothing: node 0's store, fixed ranks.
  CHECK_FALSE(parse({"--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d", "p"}).ranks_by_arrival);
  CHECK_FALSE(parse({"--nnodes=1:3", "--rdzv_endpoint=h", "p"}).ranks_by_arrival);
  CHECK(parse({"--nnodes=1:3", "--rdzv_endpoint=h", "p"}).elastic_rounds());
  CHECK_FALSE(parse({"--rdzv_endpoint=h", "p"}).ranks_by_arrival);
  CHECK(parse({"--rdzv_endpoint=h", "p"}).run_id == "none");
  CHECK(parse({"p"}).run_id.empty());  // without an endpoint: generated later, as before

  // is_host, with torchrun's spellings of a boolean.
  for (const char* yes : {"true", "1", "True", "yes", "Y", "t"}) {
    auto o = parse({"--rdzv_endpoint=h", std::string("--rdzv_conf=is_host=") + yes, "p"});
    REQUIRE(o.rdzv_is_host.has_value());
    CHECK(*o.rdzv_is_host);
    CHECK(o.rdzv_conf_notes.empty());
  }
  auto no = parse({"--rdzv_endpoint=h", "--rdzv_conf=is_host=false", "p"});
  REQUIRE(no.rdzv_is_host.has_value());
  CHECK_FALSE(*no.rdzv_is_host);
  // Without an endpoint there is nothing to host: said, not refused.
  auto lone = parse({"--rdzv_conf=is_host=1", "p"});
  REQUIRE(lone.rdzv_conf_notes.size() == 1);
  CHECK_THAT(lone.rdzv_conf_notes[0], Catch::Contains("is_host has no effect"));
}

TEST_CASE("an endpoint splits as torchrun's: the port follows the last ':'", "[options]") {
  auto endpoint = [](const std::string& text) {
    auto o = parse({"--nnodes=2", "--rdzv_endpoint=" + text, "p"});
    return std::make_pair(*o.rdzv_host, o.rdzv_port);
  };
  using Endpoint = std::pair<std::string, int>;
  CHECK(endpoint("fd00::1:2940") == Endpoint{"fd00::1", 2940});  // unbracketed IPv6: the last group is the port
  CHECK(endpoint("[fd00::1:2940]") == Endpoint{"fd00::1:2940", 29400});
  CHECK(endpoint("[fd00::1]:2940") == Endpoint{"fd00::1", 2940});
  CHECK(endpoint(" node_0.a-b:7 ") == Endpoint{"node_0.a-b", 7});  // trimmed, as torchrun strips it
  // Every bad endpoint is refused at once (exit 2), quoting the whole value.
  for (const char* bad : {"a:b:c", "fe80::2", "h:99999", "h:0x50", "h:", "[::1", "[::1]x", "a/b:1", "[]:5", " "}) {
    INFO("endpoint: " << bad);
    std::string message = usage_error({"--nnodes=2", std::string("--rdzv_endpoint=") + bad, "p"});
    CHECK_THAT(message, Catch::StartsWith(std::string("invalid --rdzv_endpoint '") + bad + "'"));
  }
}

TEST_CASE("standalone ignores an endpoint and a backend from flags or PET variables as torchrun does",
          "[options]") {
  auto o = parse({"--standalone", "--rdzv_endpoint=nohost.invalid:29400", "--rdzv_backend=c10d", "--rdzv_id=j1", "p"});
  CHECK(o.standalone);
  CHECK_FALSE(o.rdzv_host.has_value());
  CHECK(o.run_id == "j1");  // kept, unlike torchrun's: it names the log folder and the job for ddprun status
  REQUIRE(o.torchrun_notes.size() == 1);
  CHECK(o.torchrun_notes[0] == "--standalone ignores --rdzv_endpoint=nohost.invalid:29400, --rdzv_backend=c10d, "
                               "as torchrun's: a local store on a free port");
  // Values it replaces are not checked either: torchrun never reads them.
  CHECK_FALSE(parse({"--standalone", "--rdzv_endpoint=a:b:c", "p"}).rdzv_host.has_value());
  CHECK(parse({"--standalone", "p"}).torchrun_notes.empty());

  testing::ScopedEnv env;
  env.set("PET_STANDALONE", "1");
  env.set("PET_RDZV_ENDPOINT", "nohost.invalid:29400");
  auto inherited = parse({"p"});
  CHECK(inherited.standalone);
  CHECK_FALSE(inherited.rdzv_host.has_value());
  REQUIRE(inherited.torchrun_notes.size() == 1);
  CHECK_THAT(inherited.torchrun_notes[0], Catch::StartsWith("--standalone ignores --rdzv_endpoint=nohost.invalid"));
}

TEST_CASE("symbolic worker counts and redirect maps parse", "[options]") {
  for (const char* spec : {"gpu", "cpu", "auto"}) CHECK(parse({std::string("--nproc_per_node=") + spec, "p"}).nproc_per_node == spec);
  auto o = parse({"--redirects", "0:3,2:1", "--tee=2", "--local_ranks_filter=0,2", "--nnodes=1:1", "p"});
  CHECK(o.redirects.for_rank(0) == 3u);
  CHECK(o.redirects.for_rank(1) == 0u);
  CHECK(o.redirects.for_rank(2) == 1u);
  CHECK(o.tee.for_rank(5) == 2u);
  CHECK(*o.local_ranks_filter == std::set<int>{0, 2});
}

TEST_CASE("each bad value is one UsageError naming the flag", "[options]") {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{}, "no program given"},
      {{"--nproc_per_node=0", "p"}, "--nproc_per_node"},
      {{"--nproc_per_node=-2", "p"}, "--nproc_per_node"},
      {{"--nproc_per_node=two", "p"}, "--nproc_per_node"},
      {{"--nproc_per_node=4x", "p"}, "--nproc_per_node"},
      {{"--nnodes=2", "--standalone", "p"}, "single-node"},
      {{"--rdzv_endpoint=host:", "p"}, "--rdzv_endpoint"},
      {{"--rdzv_endpoint=[::1", "p"}, "--rdzv_endpoint"},
      {{"--rdzv_endpoint=[::1]x", "p"}, "--rdzv_endpoint"},
      {{"--rdzv_endpoint=h:99999", "--rdzv_id=j", "p"}, "--rdzv_endpoint"},
      {{"--rdzv_backend=etcd", "p"}, "--rdzv_backend"},
      {{"--heartbeat_timeout=1", "p"}, "--heartbeat_timeout"},
      {{"--join_timeout=0", "p"}, "--join_timeout"},
      {{"--nnodes=x", "p"}, "--nnodes"},
      {{"--nnodes=3:2", "p"}, "MIN:MAX with 1 <= MIN <= MAX"},
      {{"--nnodes=0:2", "p"}, "--nnodes"},
      {{"--nnodes=1:", "p"}, "--nnodes"},
      {{"--nnodes=1:2", "--standalone", "p"}, "--nnodes 1:2 is an elastic job"},
      {{"--nnodes=1:3", "--node_rank=3", "p"}, "(MAX of 1:3)"},
      {{"--rdzv_conf=bogus=1", "p"}, "unknown key 'bogus'"},
      {{"--rdzv_conf=join_timeout", "p"}, "expected key=value"},
      {{"--rdzv_conf=join_timeout=0", "p"}, "join_timeout=0 is not a number of seconds > 0"},
      {{"--rdzv_conf=last_call_timeout=-1", "p"}, "last_call_timeout=-1"},
      {{"--rdzv_conf=read_timeout=soon", "p"}, "read_timeout=soon"},
      {{"--rdzv_conf=keep_alive_max_attempt=0", "p"}, "keep_alive_max_attempt=0"},
      {{"--rdzv_conf=is_host=maybe", "p"}, "is_host=maybe"},
      {{"--node_rank=1", "p"}, "--node_rank"},
      {{"--master_port=0", "p"}, "--master_port"},
      {{"--master_port=70000", "p"}, "--master_port"},
      {{"--master_port=http", "p"}, "--master_port"},
      {{"--master_addr=", "p"}, "empty value for --master_addr"}, {{"--master_addr", "a b", "p"}, "--master_addr"},
      {{"--role=", "p"}, "empty value for --role"}, {{"--role", "", "p"}, "--role"},
      {{"--rdzv_id=a/b", "p"}, "--rdzv_id"},
      {{"--max_restarts=-1", "p"}, "--max_restarts"},
      {{"--redirects=4", "p"}, "--redirects"},
      {{"--redirects=0:1,0:2", "p"}, "twice"},
      {{"--tee=x:1", "p"}, "--tee"},
      {{"--local_ranks_filter=a", "p"}, "--local_ranks_filter"},
      {{"--monitor_interval=-1", "p"}, "--monitor_interval"},
      {{"--monitor_interval=nan", "p"}, "--monitor_interval"},
      {{"--grace_period=-1", "p"}, "--grace_period"},
      {{"--module", "--no_python", "p"}, "together"},
      {{"--bogus", "p"}, "--bogus"},
      {{"--nproc_per_node"}, "--nproc_per_node"},
  };
  for (const auto& c : cases) {
    INFO("args: " << Catch::rangeToString(c.args));
    std::string message = usage_error(c.args);
    CHECK_THAT(message, Catch::Contains(c.expect));
    CHECK(message.find('\n') == std::string::npos);
  }
}

TEST_CASE("stall flags: defaults, both spellings, bad values refused", "[options]") {
  auto d = parse({"prog"});
  CHECK(d.stall_timeout == 300.0);
  CHECK_FALSE(d.stall_stop);
  auto o = parse({"--stall-timeout=2.5", "--stall_action", "stop", "prog"});
  CHECK(o.stall_timeout == 2.5);
  CHECK(o.stall_stop);
  CHECK(parse({"--stall_timeout=0", "prog"}).stall_timeout == 0.0);
  CHECK(usage_error({"--stall_timeout=-1", "prog"}) == "invalid --stall_timeout '-1': expected a number of seconds >= 0");
  CHECK(usage_error({"--stall_action=kill", "prog"}) == "invalid --stall_action 'kill': expected report or stop");
}

TEST_CASE("nnodes MIN:MAX is an elastic range, N and N:N a fixed count", "[options]") {
  auto elastic = parse({"--nnodes=2:4", "p"});
  CHECK(elastic.min_nodes == 2);
  CHECK(elastic.nnodes == 4);
  CHECK(elastic.elastic());
  CHECK(elastic.last_call_timeout == 30.0);  // torchrun's default
  CHECK_FALSE(elastic.node_rank_given);
  auto fixed = parse({"--nnodes=3:3", "p"});
  CHECK(fixed.min_nodes == 3);
  CHECK(fixed.nnodes == 3);
  CHECK_FALSE(fixed.elastic());
  CHECK_FALSE(parse({"--nnodes=3", "p"}).elastic());
  // Any rank below MAX is an order hint; several nodes may give the same one.
  auto hinted = parse({"--nnodes", "1:4", "--node-rank", "3", "p"});
  CHECK(hinted.node_rank == 3);
  CHECK(hinted.node_rank_given);
}

TEST_CASE("rdzv_conf: torchrun's keys, the --join_timeout flag wins, ignored keys say why", "[options]") {
  auto o = parse({"--nnodes=1:3", "--rdzv_conf=join_timeout=45,last_call_timeout=2.5", "p"});
  CHECK(o.join_timeout == 45.0);
  CHECK(o.last_call_timeout == 2.5);
  CHECK(o.rdzv_conf_notes.empty());
  CHECK(parse({"--nnodes=1:3", "--rdzv-conf", "timeout=7", "p"}).join_timeout == 7.0);  // torchrun's alias
  CHECK(parse({"--nnodes=1:3", "--rdzv_conf=last_call_timeout=0", "p"}).last_call_timeout == 0.0);
  // An explicit --join_timeout wins, in either order.
  CHECK(parse({"--join_timeout=9", "--nnodes=1:3", "--rdzv_conf=join_timeout=45", "p"}).join_timeout == 9.0);
  CHECK(parse({"--rdzv_conf=join_timeout=45", "--join_timeout=9", "p"}).join_timeout == 9.0);

  auto ignored = parse({"--nnodes=1:3",
                        "--rdzv_conf=close_timeout=10,read_timeout=60,keep_alive_interval=5,keep_alive_max_attempt=3,"
                        "use_agent_store=False,is_host=true",
                        "p"});
  REQUIRE(ignored.rdzv_conf_notes.size() == 6);
  for (const auto& note : ignored.rdzv_conf_notes) CHECK_THAT(note, Catch::Contains("has no effect: "));
  CHECK_THAT(ignored.rdzv_conf_notes[1], Catch::StartsWith("--rdzv_conf read_timeout") &&
                                              Catch::Contains("--heartbeat_timeout"));
  CHECK(ignored.join_timeout == 600.0);
  auto fixed = parse({"--nnodes=2", "--rdzv_conf=last_call_timeout=5", "p"});
  REQUIRE(fixed.rdzv_conf_notes.size() == 1);
  CHECK_THAT(fixed.rdzv_conf_notes[0], Catch::Contains("fixed count"));
  // The keys torchrun 2.x's c10d rendezvous reads besides: accepted, each with its reason.
  // Keys and values stripped of white space, as torchrun's parser does.
  auto more = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=h:29400",
                     "--rdzv_conf= heartbeat_timeout = 5, cas_backoff_max_seconds=0.5 ,store_type= TCP ", "p"});
  REQUIRE(more.rdzv_conf_notes.size() == 2);
  CHECK_THAT(more.rdzv_conf_notes[0], Catch::StartsWith("--rdzv_conf heartbeat_timeout has no effect: "));
  CHECK_THAT(more.rdzv_conf_notes[1], Catch::StartsWith("--rdzv_conf cas_backoff_max_seconds has no effect: "));
  CHECK(parse({"--rdzv_conf=cas_backoff_max_seconds=0", "p"}).rdzv_conf_notes.size() == 1);
  CHECK(parse({"--nnodes=1:3", "--rdzv_conf=join_timeout=5, last_call_timeout=3", "p"}).last_call_timeout == 3.0);
  CHECK(parse({"--rdzv_conf=  ", "p"}).rdzv_conf_notes.empty());
  // store_type: read by c10d (and --standalone, which is c10d), not by the static rendezvous.
  CHECK(parse({"--standalone", "--rdzv_conf=store_type=tcp", "p"}).rdzv_conf_notes.empty());
  CHECK_THAT(usage_error({"--rdzv_backend=c10d", "--rdzv_endpoint=h", "--rdzv_conf=store_type=file", "p"}),
             Catch::Contains("store_type=file is torchrun's FileStore") && Catch::Contains("give tcp"));
  CHECK_THAT(usage_error({"--standalone", "--rdzv_conf=store_type=etcd", "p"}),
             Catch::Contains("store_type=etcd is not tcp or file"));
  auto statik = parse({"--rdzv_conf=store_type=file", "p"});
  REQUIRE(statik.rdzv_conf_notes.size() == 1);
  CHECK_THAT(statik.rdzv_conf_notes[0], Catch::Contains("store_type has no effect: only torchrun's c10d"));
  // An empty key or value, as torchrun: a trailing comma, "key=".
  CHECK_THAT(usage_error({"--rdzv_conf=join_timeout=5,", "p"}), Catch::Contains("expected key=value, got ''"));
  CHECK_THAT(usage_error({"--rdzv_conf=store_type= ", "p"}), Catch::Contains("store_type has no value"));
  CHECK_THAT(usage_error({"--rdzv_conf==5", "p"}), Catch::Contains("expected key=value, got '=5'"));
  CHECK_THAT(usage_error({"--rdzv_conf=cas_backoff_max_seconds=inf", "p"}),
             Catch::Contains("cas_backoff_max_seconds=inf is not a number of seconds >= 0"));
  CHECK_THAT(usage_error({"--rdzv_conf=heartbeat_timeout=0", "p"}),
             Catch::Contains("heartbeat_timeout=0 is not a number of seconds > 0"));
  // A bad key's message lists the keys there are.
  CHECK_THAT(usage_error({"--rdzv_conf=rdzv_timeout=3", "p"}),
             Catch::Contains("the keys are join_timeout, timeout, last_call_timeout, close_timeout"));
}

namespace {

// A Slurm job step's variables for the scope of a test (the process had none before).
struct SlurmStep {
  std::map<std::string, std::string> vars;
  SlurmStep(int node, int nnodes) {
    vars = {{"SLURM_JOB_ID", "5150"},       {"SLURM_STEP_ID", "0"},
            {"SLURM_NNODES", std::to_string(nnodes)}, {"SLURM_STEP_NUM_NODES", std::to_string(nnodes)},
            {"SLURM_NODEID", std::to_string(node)},   {"SLURM_STEP_NODELIST", "n[0-1]"},
            {"SLURM_JOB_NODELIST", "n[0-1]"},         {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~SlurmStep() {
    for (const auto& [k, v] : vars) unsetenv(k.c_str());
  }
};

}  // namespace

TEST_CASE("srun ddprun: Slurm's node count is fixed, and MIN:MAX keeps Slurm's node order", "[options]") {
  SlurmStep step(1, 2);
  auto fixed = parse({"p"});
  CHECK(fixed.nnodes == 2);
  CHECK_FALSE(fixed.elastic());  // SLURM_NNODES is a count, not a range
  auto elastic = parse({"--nnodes=1:3", "p"});
  CHECK(elastic.min_nodes == 1);
  CHECK(elastic.nnodes == 3);
  CHECK(elastic.node_rank == 1);  // from SLURM_NODEID: the order hint
  CHECK(elastic.node_rank_given);
  CHECK(elastic.master_addr == "n0");
}
