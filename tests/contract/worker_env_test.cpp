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
  CHECK(first < 40001);
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
