// Slurm facts: hostlist expressions, tasks per node, the per-job port, and the
// worker runtime's reading of an srun task-per-GPU environment.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "ddp/contract/slurm.hpp"
#include "ddp/contract/worker_env.hpp"

namespace slurm = ddp::contract::slurm;
using ddp::contract::Variables;
using ddp::contract::WorkerEnv;
using slurm::expand_hostlist;
using Hosts = std::vector<std::string>;

TEST_CASE("hostlist expressions expand like Slurm's", "[slurm]") {
  CHECK(expand_hostlist("n0") == Hosts{"n0"});
  CHECK(expand_hostlist("n[0-1]") == Hosts{"n0", "n1"});
  CHECK(expand_hostlist("node[01-04,07],gpu-a[1-2]") ==
        Hosts{"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"});
  CHECK(expand_hostlist("rack[1-2]-n[1-2]") == Hosts{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(expand_hostlist("a[098-101]") == Hosts{"a098", "a099", "a100", "a101"});
  CHECK(expand_hostlist("x,y[3],z") == Hosts{"x", "y3", "z"});
  CHECK(expand_hostlist("n[1-3]-ib") == Hosts{"n1-ib", "n2-ib", "n3-ib"});
  CHECK(expand_hostlist("a[1,3-4]b[2]") == Hosts{"a1b2", "a3b2", "a4b2"});
  CHECK(expand_hostlist("n[9223372036854775807]") == Hosts{"n9223372036854775807"});  // no overflow past the end
}

TEST_CASE("malformed hostlists are refused with the reason", "[slurm]") {
  for (const char* bad : {"n[1-", "n]1[", "n[]", "n[3-1]", "n[a-b]", "a,,b", "n[[1]]", ""}) {
    INFO(bad);
    CHECK_THROWS_AS(expand_hostlist(bad), std::invalid_argument);
  }
  CHECK_THROWS_WITH(expand_hostlist("n[0-99999999]", 1000), Catch::Contains("more than 1000 hosts"));
}

TEST_CASE("tasks per node and the per-job port", "[slurm]") {
  CHECK(slurm::tasks_on_node("2(x3),1", 0) == 2);
  CHECK(slurm::tasks_on_node("2(x3),1", 2) == 2);
  CHECK(slurm::tasks_on_node("2(x3),1", 3) == 1);
  CHECK(slurm::tasks_on_node("4", 0) == 4);
  CHECK_THROWS_AS(slurm::tasks_on_node("2(x3),1", 4), std::invalid_argument);
  CHECK_THROWS_AS(slurm::tasks_on_node("2(x", 0), std::invalid_argument);
  for (long job : {0L, 1L, 12345L, 99999999L}) {
    int port = slurm::rendezvous_port(job, 0);
    CHECK(port >= 10000);
    CHECK(port < 30000);
  }
  CHECK(slurm::rendezvous_port(77, 0) != slurm::rendezvous_port(78, 0));
  CHECK(slurm::rendezvous_port(77, 0) != slurm::rendezvous_port(77, 1));
  CHECK(slurm::rendezvous_port(100, 8) != slurm::rendezvous_port(101, 0));  // steps do not run into the next job
}

TEST_CASE("srun with one task per GPU maps SLURM_* to the worker environment", "[slurm][worker_env]") {
  std::map<std::string, std::string> vars = {
      {"SLURM_JOB_ID", "4242"},   {"SLURM_STEP_ID", "0"},  {"SLURM_PROCID", "3"},
      {"SLURM_NTASKS", "4"},      {"SLURM_LOCALID", "1"},  {"SLURM_NODEID", "1"},
      {"SLURM_NNODES", "2"},      {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_NODELIST", "gpu-a[07-08]"}};
  auto e = WorkerEnv::from_variables(Variables(vars));
  CHECK(e.launcher == ddp::contract::Launcher::Slurm);
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);
  CHECK(e.group_rank == 1);
  CHECK(e.group_world_size == 2);
  CHECK(e.master_addr == "gpu-a07");
  CHECK(e.master_port == slurm::rendezvous_port(4242, 0));
  CHECK(e.run_id == "slurm-4242.0");
  vars["SLURM_LOCALID"] = "2";  // more than the node's 2 tasks
  CHECK_THROWS_WITH(WorkerEnv::from_variables(Variables(vars)), Catch::Contains("SLURM_LOCALID"));
  vars["SLURM_LOCALID"] = "1";
  vars["SLURM_TASKS_PER_NODE"] = "2(x";
  CHECK_THROWS_WITH(WorkerEnv::from_variables(Variables(vars)), Catch::Contains("SLURM_TASKS_PER_NODE"));
}
