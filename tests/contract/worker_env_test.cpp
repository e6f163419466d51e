// contract::WorkerEnv reads the launch contract and rejects contradictions, and
// writes what it reads.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "ddp/contract/worker_env.hpp"

namespace {
using ddp::contract::Variables;
using ddp::contract::WorkerEnv;
using Vars = std::map<std::string, std::string>;
}  // namespace

TEST_CASE("a full torchrun environment is read", "[worker_env]") {
  const Variables env(Vars{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                 {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"ROLE_NAME", "trainer"},
                 {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "abc"},
                 {"TORCHELASTIC_RESTART_COUNT", "2"}});
  auto e = WorkerEnv::from_variables(env);
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 4);
  CHECK(e.group_rank == 1);
  CHECK(e.group_world_size == 2);
  CHECK(e.role_name == "trainer");
  CHECK(e.master_addr == "10.0.0.1");
  CHECK(e.master_port == 29500);
  CHECK(e.run_id == "abc");
  CHECK(e.restart_count == 2);
  CHECK(e.store_port() == 29500);  // no agent store: rank 0 hosts on MASTER_PORT
}

TEST_CASE("under torchrun's agent store the runtime's store goes on a port derived alike by every rank",
          "[worker_env]") {
  // The store port seen by a process with torchrun's variables plus `extra`.
  auto port_with = [](std::map<std::string, std::string> extra) {
    std::map<std::string, std::string> vars = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                               {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "job7"},
                                               {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
    for (auto& [k, v] : extra) vars.insert_or_assign(k, v);
    const Variables env(vars);
    return WorkerEnv::from_variables(env).store_port();
  };
  const int first = port_with({});
  CHECK(first != 29500);
  CHECK(first >= 20000);
  CHECK(first < 32768);  // below Linux's ephemeral ports, which connections hold
  CHECK(port_with({{"RANK", "1"}}) == first);                          // another rank: the same port
  CHECK(port_with({{"TORCHELASTIC_RESTART_COUNT", "1"}}) != first);    // a restarted attempt: its own
  CHECK(port_with({{"TORCHELASTIC_USE_AGENT_STORE", "False"}}) == 29500);
}

TEST_CASE("missing or contradictory variables are named in the error", "[worker_env]") {
  {
    const Variables env(Vars{{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK_THROWS_WITH(WorkerEnv::from_variables(env), Catch::Contains("RANK is not set"));
  }
  {
    const Variables env(Vars{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK_THROWS_WITH(WorkerEnv::from_variables(env), Catch::Contains("RANK='2'"));
  }
  {
    const Variables env(Vars{{"RANK", "0"}, {"WORLD_SIZE", "x"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK_THROWS_WITH(WorkerEnv::from_variables(env), Catch::Contains("WORLD_SIZE='x'"));
  }
  {
    const Variables env(Vars{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "99999"}});
    CHECK_THROWS_WITH(WorkerEnv::from_variables(env), Catch::Contains("MASTER_PORT"));
  }
  {
    const Variables env(Vars{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "1"}});
    CHECK_THROWS_WITH(WorkerEnv::from_variables(env), Catch::Contains("MASTER_ADDR"));
  }
}

TEST_CASE("what ddprun writes the worker runtime reads back unchanged", "[worker_env]") {
  WorkerEnv w;
  w.launcher = ddp::contract::Launcher::Ddprun;
  w.rank = 5;
  w.world_size = 8;
  w.local_rank = 1;
  w.local_world_size = 4;
  w.group_rank = 1;
  w.group_world_size = 2;
  w.role_name = "trainer";
  w.master_addr = "10.0.0.1";
  w.master_port = 29500;
  w.run_id = "abc123";
  w.restart_count = 2;
  w.max_restarts = 3;
  // Attempt 3 with restart count 2: an elastic job re-formed once for a joining node.
  w.store = ddp::contract::StoreEndpoint{"10.0.0.1", 29400, "s3cret", "job", "attempt/3/pg/", 3};
  w.single_omp_thread = true;
  w.use_agent_store = true;  // ddprun's store serves torch workers on MASTER_PORT
  const auto vars = w.to_env();
  // torchrun's names, for unmodified PyTorch programs.
  CHECK(vars.at("RANK") == "5");
  CHECK(vars.at("ROLE_RANK") == "5");
  CHECK(vars.at("ROLE_WORLD_SIZE") == "8");
  CHECK(vars.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
  CHECK(vars.at("TORCHELASTIC_MAX_RESTARTS") == "3");
  CHECK(vars.at("DDPRUN_NODE_RANK") == "1");
  CHECK(vars.at("DDPRUN_RUN_ID") == "abc123");
  CHECK(vars.at("OMP_NUM_THREADS") == "1");

  const WorkerEnv r = WorkerEnv::from_variables(Variables(vars));
  CHECK(r.launcher == ddp::contract::Launcher::Ddprun);
  CHECK(r.rank == w.rank);
  CHECK(r.world_size == w.world_size);
  CHECK(r.local_rank == w.local_rank);
  CHECK(r.local_world_size == w.local_world_size);
  CHECK(r.group_rank == w.group_rank);
  CHECK(r.group_world_size == w.group_world_size);
  CHECK(r.role_name == w.role_name);
  CHECK(r.master_addr == w.master_addr);
  CHECK(r.master_port == w.master_port);
  CHECK(r.run_id == w.run_id);
  CHECK(r.restart_count == w.restart_count);
  CHECK(r.max_restarts == w.max_restarts);
  CHECK(r.use_agent_store);
  CHECK(r.single_omp_thread);
  REQUIRE(r.store);
  CHECK(r.store->addr == "10.0.0.1");
  CHECK(r.store->port == 29400);
  CHECK(r.store->token == "s3cret");
  CHECK(r.store->ns == "job");
  CHECK(r.store->prefix == "attempt/3/pg/");
  CHECK(r.store->attempt == 3);
  // ddprun's store holds MASTER_PORT: a store of the runtime's own would go elsewhere.
  CHECK(r.store_port() != 29500);
}

TEST_CASE("without DDPRUN_STORE_* the launcher is torchrun and nothing of ddprun's is written", "[worker_env]") {
  const Variables env(Vars{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  const WorkerEnv e = WorkerEnv::from_variables(env);
  CHECK(e.launcher == ddp::contract::Launcher::Torchrun);
  CHECK_FALSE(e.store);
  const auto vars = e.to_env();
  CHECK(vars.count("DDPRUN_STORE_ADDR") == 0);
  CHECK(vars.count("OMP_NUM_THREADS") == 0);
  CHECK(std::string(ddp::contract::launcher_name(e.launcher)) == "torchrun");
}

TEST_CASE("DDPRUN_TOKEN is the token of rank 0's own store, and only where ddprun gives none", "[worker_env]") {
  Vars torchrun = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  CHECK(WorkerEnv::from_variables(Variables(torchrun)).token.empty());
  torchrun["DDPRUN_TOKEN"] = "s3cret";
  CHECK(WorkerEnv::from_variables(Variables(torchrun)).token == "s3cret");
  const Vars mpirun = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"},
                       {"DDPRUN_TOKEN", "s3cret"}};
  CHECK(WorkerEnv::from_variables(Variables(mpirun)).token == "s3cret");
  // Under ddprun the job's store has its own token (DDPRUN_STORE_TOKEN); a DDPRUN_TOKEN
  // the worker inherited from ddprun's environment is not the runtime's to use.
  Vars ddprun = torchrun;
  ddprun["DDPRUN_STORE_ADDR"] = "127.0.0.1";
  ddprun["DDPRUN_STORE_PORT"] = "4000";
  ddprun["DDPRUN_STORE_TOKEN"] = "job-token";
  const auto e = WorkerEnv::from_variables(Variables(ddprun));
  CHECK(e.token.empty());
  CHECK(e.store->token == "job-token");
}

TEST_CASE("without DDPRUN_STORE_ATTEMPT (an older ddprun) the attempt is unknown, and a bad one is named",
          "[worker_env]") {
  Vars vars{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"},
            {"DDPRUN_STORE_ADDR", "127.0.0.1"}, {"DDPRUN_STORE_PORT", "29400"}};
  const auto e = WorkerEnv::from_variables(Variables(vars));
  REQUIRE(e.store);
  CHECK(e.store->attempt == -1);
  vars["DDPRUN_STORE_ATTEMPT"] = "two";
  CHECK_THROWS_WITH(WorkerEnv::from_variables(Variables(vars)), Catch::Contains("DDPRUN_STORE_ATTEMPT='two'"));
}

TEST_CASE("a malformed DDPRUN_STORE_PORT is named", "[worker_env]") {
  const Variables env(Vars{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"},
                           {"DDPRUN_STORE_ADDR", "127.0.0.1"}, {"DDPRUN_STORE_PORT", "70000"}});
  CHECK_THROWS_WITH(WorkerEnv::from_variables(env), Catch::Contains("DDPRUN_STORE_PORT='70000'"));
}

TEST_CASE("the DDP_* settings are read once, with their defaults, and bad values are named", "[comm_settings]") {
  using ddp::contract::CommSettings;
  const CommSettings d = CommSettings::from_variables(Variables{});
  CHECK_FALSE(d.timeout);
  CHECK_FALSE(d.backend);
  CHECK_FALSE(d.disable_shm);
  CHECK_FALSE(d.disable_cma);
  CHECK(d.spin_us == -1);
  CHECK(d.shm_ring_bytes == 0);
  CHECK(d.small_allreduce_bytes == 32 * 1024);
  CHECK(d.staged_allreduce_bytes == 1024 * 1024);
  CHECK(d.wait_notice_every.count() == 30000);
  CHECK_FALSE(d.socket_ifname);

  const CommSettings s = CommSettings::from_variables(
      Variables(Vars{{"DDP_TIMEOUT_SEC", "2.5"}, {"DDP_BACKEND", "cpu"}, {"DDP_DISABLE_SHM", "1"},
                     {"DDP_DISABLE_CMA", "1"}, {"DDP_SPIN_US", "0"}, {"DDP_SHM_RING_BYTES", "65536"},
                     {"DDP_SMALL_ALLREDUCE_BYTES", "1024"}, {"DDP_WAIT_NOTICE_SEC", "0.5"},
                     {"DDP_SOCKET_IFNAME", "^docker,lo"}}));
  REQUIRE(s.timeout);
  CHECK(s.timeout->count() == 2500);
  CHECK(*s.backend == "cpu");
  CHECK(s.disable_shm);
  CHECK(s.disable_cma);
  CHECK(s.spin_us == 0);
  CHECK(s.shm_ring_bytes == 65536);
  CHECK(s.small_allreduce_bytes == 1024);
  CHECK(s.wait_notice_every.count() == 500);
  CHECK(s.socket_ifname == "^docker,lo");

  auto fails = [](const char* name, const char* value) {
    return CommSettings::from_variables(Variables(Vars{{name, value}}));
  };
  CHECK_THROWS_WITH(fails("DDP_TIMEOUT_SEC", "0"), Catch::Contains("DDP_TIMEOUT_SEC='0'"));
  CHECK_THROWS_WITH(fails("DDP_TIMEOUT_SEC", "nan"), Catch::Contains("DDP_TIMEOUT_SEC"));
  CHECK_THROWS_WITH(fails("DDP_WAIT_NOTICE_SEC", "-3"), Catch::Contains("DDP_WAIT_NOTICE_SEC='-3'"));
  CHECK_THROWS_WITH(fails("DDP_DISABLE_SHM", "yes"), Catch::Contains("DDP_DISABLE_SHM='yes'"));
  CHECK_THROWS_WITH(fails("DDP_SPIN_US", "5x"), Catch::Contains("DDP_SPIN_US='5x'"));
  CHECK_THROWS_WITH(fails("DDP_SHM_RING_BYTES", "-1"), Catch::Contains("DDP_SHM_RING_BYTES"));
}

TEST_CASE("the shared parsers take whole numbers and plain durations only", "[parse]") {
  using namespace ddp::contract;
  CHECK(parse_integer("42") == 42);
  CHECK_FALSE(parse_integer("42 "));
  CHECK_FALSE(parse_integer(""));
  CHECK_FALSE(parse_integer("99999999999999999999"));
  CHECK(parse_decimal("0.5") == 0.5);
  CHECK_FALSE(parse_decimal("inf"));
  CHECK_FALSE(parse_decimal("1e3"));
  CHECK(parse_seconds("0.25") == Millis(250));
  CHECK_FALSE(parse_seconds("0"));
  CHECK_FALSE(parse_seconds("-1"));
  CHECK_FALSE(parse_seconds("2e9"));
  // Empty counts as unset, as launchers often export VAR= to clear one.
  const Variables v(Vars{{"A", ""}, {"B", "7"}});
  CHECK_FALSE(v.has("A"));
  CHECK(v.integer_or("A", 3, 0, 10) == 3);
  CHECK(v.integer("B", 0, 10) == 7);
  CHECK_THROWS_WITH(v.integer("C", 0, 10, "start it with ddprun"), Catch::Contains("C is not set: start it with ddprun"));
  CHECK_THROWS_WITH(v.integer("B", 0, 5), Catch::Contains("B='7' is not an integer in [0, 5]"));
}

TEST_CASE("OMP_NUM_THREADS=1 is chosen for several workers only when the user left it unset", "[worker_env]") {
  CHECK(WorkerEnv::wants_single_omp_thread(Variables(Vars{}), 2));
  CHECK_FALSE(WorkerEnv::wants_single_omp_thread(Variables(Vars{}), 1));
  CHECK_FALSE(WorkerEnv::wants_single_omp_thread(Variables(Vars{{"OMP_NUM_THREADS", "4"}}), 8));
  CHECK(WorkerEnv::wants_single_omp_thread(Variables(Vars{{"OMP_NUM_THREADS", ""}}), 2));  // empty counts as unset
}

TEST_CASE("a virtual local rank's one GPU is written as CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES when asked", "[worker_env]") {
  WorkerEnv w;
  CHECK(w.to_env().count("CUDA_VISIBLE_DEVICES") == 0);  // inherited from the launcher
  w.visible_device = "7";
  auto vars = w.to_env();
  CHECK(vars.at("CUDA_VISIBLE_DEVICES") == "7");
  CHECK(vars.count("HIP_VISIBLE_DEVICES") == 0);
  w.hip_visible_device = true;
  vars = w.to_env();
  CHECK(vars.at("CUDA_VISIBLE_DEVICES") == "7");
  CHECK(vars.at("HIP_VISIBLE_DEVICES") == "7");
}
