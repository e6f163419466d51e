// Slurm facts: hostlist expressions, tasks per node, the per-job port, and the
// worker runtime's reading of an srun task-per-GPU environment.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include "ddp/launch_env.hpp"
#include "ddp/slurm.hpp"

using ddp::slurm::expand_hostlist;
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
  CHECK(ddp::slurm::tasks_on_node("2(x3),1", 0) == 2);
  CHECK(ddp::slurm::tasks_on_node("2(x3),1", 2) == 2);
  CHECK(ddp::slurm::tasks_on_node("2(x3),1", 3) == 1);
  CHECK(ddp::slurm::tasks_on_node("4", 0) == 4);
  CHECK_THROWS_AS(ddp::slurm::tasks_on_node("2(x3),1", 4), std::invalid_argument);
  CHECK_THROWS_AS(ddp::slurm::tasks_on_node("2(x", 0), std::invalid_argument);
  for (long job : {0L, 1L, 12345L, 99999999L}) {
    int port = ddp::slurm::rendezvous_port(job, 0);
    CHECK(port >= 10000);
    CHECK(port < 30000);
  }
  CHECK(ddp::slurm::rendezvous_port(77, 0) != ddp::slurm::rendezvous_port(78, 0));
  CHECK(ddp::slurm::rendezvous_port(77, 0) != ddp::slurm::rendezvous_port(77, 1));
  CHECK(ddp::slurm::rendezvous_port(100, 8) != ddp::slurm::rendezvous_port(101, 0));  // steps do not run into the next job
}

TEST_CASE("srun with one task per GPU maps SLURM_* to the launch environment", "[slurm][launch_env]") {
  for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "GROUP_RANK", "GROUP_WORLD_SIZE", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST"}) {
    unsetenv(k);
  }
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NODEID", "1", 1);
  setenv("SLURM_NNODES", "2", 1);
  setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
  setenv("SLURM_JOB_NODELIST", "gpu-a[07-08]", 1);
  auto e = ddp::LaunchEnv::from_environment();
  CHECK(e.launcher == "slurm");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);
  CHECK(e.group_rank == 1);
  CHECK(e.group_world_size == 2);
  CHECK(e.master_addr == "gpu-a07");
  CHECK(e.master_port == ddp::slurm::rendezvous_port(4242, 0));
  CHECK(e.run_id == "slurm-4242.0");
  setenv("SLURM_LOCALID", "2", 1);  // more than the node's 2 tasks
  CHECK_THROWS_WITH(ddp::LaunchEnv::from_environment(), Catch::Contains("SLURM_LOCALID"));
  for (const char* k : {"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                        "SLURM_NODEID", "SLURM_NNODES", "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST"}) {
    unsetenv(k);
  }
}
