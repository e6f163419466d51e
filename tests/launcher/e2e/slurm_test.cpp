// ddprun inside a Slurm step (the environment srun gives each task): nodes, node rank,
// store host and port come from Slurm unless flags say otherwise. The real-cluster
// tests (tests/slurm/) run the same under slurmctld/slurmd.
#include <catch2/catch.hpp>

#include "e2e.hpp"

using namespace testing;

namespace {

std::map<std::string, std::string> step_env(int node, int nnodes, const std::string& nodelist, long job = 5150) {
  return {{"SLURM_JOB_ID", std::to_string(job)},    {"SLURM_STEP_ID", "0"},
          {"SLURM_NNODES", std::to_string(nnodes)}, {"SLURM_STEP_NUM_NODES", std::to_string(nnodes)},
          {"SLURM_NODEID", std::to_string(node)},   {"SLURM_STEP_NODELIST", nodelist},
          {"SLURM_JOB_NODELIST", nodelist},         {"SLURM_STEP_TASKS_PER_NODE", "1(x" + std::to_string(nnodes) + ")"},
          {"SLURM_PROCID", std::to_string(node)}};
}

bool has(const std::vector<std::string>& lines, const std::string& kv) {
  return std::find(lines.begin(), lines.end(), kv) != lines.end();
}

}  // namespace

TEST_CASE("in a Slurm step ddprun takes nodes, node rank, store host and port from Slurm", "[e2e][slurm]") {
  // Two "nodes" on this machine: the nodelist's first host is localhost.
  std::vector<std::string> probe = {e2e::kWorker, "env", "RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                    "TORCHELASTIC_RUN_ID"};
  auto args = e2e::ddprun({"--nproc_per_node=2", "--join_timeout=20"});
  args.insert(args.end(), probe.begin(), probe.end());
  Process n1(args, {step_env(1, 2, "localhost,localhost"), {}});
  Process n0(args, {step_env(0, 2, "localhost,localhost"), {}});
  for (Process* p : {&n0, &n1}) {
    auto status = p->wait(60s);
    INFO(p->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    CHECK_THAT(p->err(), Catch::Contains("Slurm step: nnodes=2 from SLURM_STEP_NUM_NODES") &&
                             Catch::Contains("first host of SLURM_STEP_NODELIST=localhost,localhost") &&
                             Catch::Contains("(from job 5150, step 0)"));
  }
  auto r0 = e2e::by_rank(n0.out()), r1 = e2e::by_rank(n1.out());
  CHECK(has(r0[1], "RANK=1"));
  CHECK(has(r1[3], "RANK=3"));
  CHECK(has(r1[3], "GROUP_RANK=1"));
  CHECK(has(r1[2], "WORLD_SIZE=4"));
  CHECK(has(r0[0], "MASTER_ADDR=localhost"));
  CHECK(has(r0[0], "TORCHELASTIC_RUN_ID=slurm-5150.0"));
}

TEST_CASE("explicit flags win over Slurm's values", "[e2e][slurm]") {
  const std::string port = std::to_string(e2e::free_port());
  std::string port_flag = "--master_port=";
  port_flag += port;  // (not "..." + port: GCC 12 warns falsely on that form here)
  auto r = run(e2e::ddprun({"--nnodes=1", "--node_rank=0", port_flag, e2e::kWorker, "env",
                            "WORLD_SIZE", "MASTER_PORT"}),
               {step_env(1, 2, "n[0-1]"), {}});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(e2e::by_rank(r.out)[0] == std::vector<std::string>{"WORLD_SIZE=1", "MASTER_PORT=" + port});
}

TEST_CASE("a step with several ddprun per node is refused with the fix", "[e2e][slurm]") {
  auto env = step_env(0, 1, "n0");
  env.insert_or_assign("SLURM_STEP_TASKS_PER_NODE", std::string("2"));
  auto r = run(e2e::ddprun({"--nproc_per_node=2", e2e::kWorker, "env", "RANK"}), {env, {}});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("srun --ntasks-per-node=1 ddprun"));
}

TEST_CASE("standalone mode in a multi-node Slurm step is refused instead of splitting the job", "[e2e][slurm]") {
  for (const char* flag : {"--standalone", "--rdzv_endpoint=localhost:0"}) {
    auto r = run(e2e::ddprun({flag, e2e::kWorker, "env", "RANK"}), {step_env(0, 2, "n[0-1]"), {}});
    INFO(flag << ": " << r.err);
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Catch::Contains("single-node jobs") && Catch::Contains("from Slurm"));
  }
}
