// The real ddprun configured by PET_* variables, as Kubernetes operators configure
// torchrun: the job takes its flags from them, the command line beats them, they beat a
// Slurm step's variables, a bad one ends ddprun with status 2 naming it, and workers
// get their own ranks whatever pod-level RANK/WORLD_SIZE/MASTER_* the pod carries.
#include <catch2/catch.hpp>

#include <algorithm>

#include "e2e.hpp"

using namespace testing;

namespace {

bool has(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

const std::vector<std::string> kProbe = {e2e::kWorker, "env", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                         "MASTER_ADDR", "MASTER_PORT", "PET_NPROC_PER_NODE"};

std::vector<std::string> probe_with(std::vector<std::string> flags) {
  auto args = e2e::ddprun(std::move(flags));
  args.insert(args.end(), kProbe.begin(), kProbe.end());
  return args;
}

// The workers' lines of a run that must have succeeded with two workers, each with its
// own RANK and WORLD_SIZE=2.
std::map<int, std::vector<std::string>> two_workers(const RunResult& r) {
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks.size() == 2);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(has(ranks[rank], "RANK=" + std::to_string(rank)));
    CHECK(has(ranks[rank], "WORLD_SIZE=2"));
  }
  return ranks;
}

}  // namespace

TEST_CASE("a pod's PET_* set the job, and pod-level RANK and WORLD_SIZE reach no worker", "[e2e][pet]") {
  // What a PyTorchJob pod carries beside PET_*: its own node rank and node count.
  const std::map<std::string, std::string> pod = {{"PET_NPROC_PER_NODE", "2"}, {"PET_STANDALONE", "1"},
                                                  {"RANK", "1"},  {"WORLD_SIZE", "2"},
                                                  {"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}};
  auto r = run(probe_with({"-v"}), {pod, {}}, 60s);
  auto ranks = two_workers(r);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(has(ranks[rank], "MASTER_ADDR=127.0.0.1"));
    CHECK_FALSE(has(ranks[rank], "MASTER_PORT=23456"));
    CHECK(has(ranks[rank], "PET_NPROC_PER_NODE=2"));  // inherited, as torchrun's workers inherit it
  }
  const auto own = e2e::own_lines(r.err);
  CHECK(has(own, "ddprun: info: --nproc_per_node=2 from PET_NPROC_PER_NODE"));
  CHECK(has(own, "ddprun: info: --standalone from PET_STANDALONE='1'"));
  CHECK(has(own, "ddprun: info: --verbose from the command line"));
}

TEST_CASE("the command line beats PET_*", "[e2e][pet]") {
  auto r = run(probe_with({"-v", "--nproc_per_node=2", "--standalone"}),
               {{{"PET_NPROC_PER_NODE", "3"}, {"PET_STANDALONE", "0"}}, {}}, 60s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(e2e::by_rank(r.out).size() == 2);
  const auto own = e2e::own_lines(r.err);
  CHECK(has(own, "ddprun: info: PET_NPROC_PER_NODE='3' not used: --nproc_per_node is on the command line"));
  CHECK(has(own, "ddprun: info: PET_STANDALONE='0' not used: --standalone is on the command line"));
}

TEST_CASE("PET_* beat a Slurm step's variables, and Slurm fills what they leave open", "[e2e][pet]") {
  // Node 1 of a two-node step, told by PET_* that it is a one-node job of its own.
  const std::string port = std::to_string(e2e::free_port());
  const std::map<std::string, std::string> env = {
      {"SLURM_JOB_ID", "5151"},     {"SLURM_STEP_ID", "0"},          {"SLURM_NNODES", "2"},
      {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_NODEID", "1"},          {"SLURM_STEP_NODELIST", "n[0-1]"},
      {"SLURM_JOB_NODELIST", "n[0-1]"}, {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}, {"PET_NNODES", "1"},
      {"PET_NODE_RANK", "0"},       {"PET_MASTER_PORT", port},       {"PET_NPROC_PER_NODE", "2"}};
  auto r = run(probe_with({}), {env, {}}, 60s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks.size() == 2);
  CHECK(has(ranks[1], "WORLD_SIZE=2"));
  CHECK(has(ranks[1], "GROUP_RANK=0"));
  CHECK(has(ranks[1], "MASTER_PORT=" + port));
  // Only the run id came from Slurm.
  CHECK(has(e2e::own_lines(r.err), "ddprun: info: Slurm step: run id slurm-5151.0"));
}

TEST_CASE("a bad PET_* value ends ddprun with status 2 and one line naming the variable", "[e2e][pet]") {
  struct Case {
    std::string variable, value, message;
  };
  const std::vector<Case> cases = {
      {"PET_NNODES", "0",
       "ddprun: error: invalid PET_NNODES '0' (from the environment, for --nnodes): expected a positive node count N, "
       "or MIN:MAX with 1 <= MIN <= MAX"},
      {"PET_STANDALONE", "true",
       "ddprun: error: invalid PET_STANDALONE 'true' (from the environment, for --standalone): expected an integer: 0 "
       "for off, any other for on"},
      {"PET_STALL_ACTION", "halt",
       "ddprun: error: invalid PET_STALL_ACTION 'halt' (from the environment, for --stall_action): expected report or "
       "stop"}};
  for (const auto& c : cases) {
    auto r = run(probe_with({}), {{{c.variable, c.value}}, {}}, 30s);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(e2e::own_lines(r.err) == std::vector<std::string>{c.message});
    CHECK(e2e::by_rank(r.out).empty());
  }
}

TEST_CASE("a launch from PET_HOSTS: the local agents ignore the PET_* they inherit", "[e2e][pet]") {
  // Each agent here is the launcher's child and inherits PET_HOSTS; were it read, an agent
  // would refuse it or launch again. Its flags come from the launcher alone.
  auto r = run(probe_with({}), {{{"PET_HOSTS", "localhost:1,127.0.0.1:1"}, {"PET_NPROC_PER_NODE", "1"}}, {}}, 60s);
  auto ranks = two_workers(r);
  for (int rank = 0; rank < 2; ++rank) CHECK(has(ranks[rank], "GROUP_RANK=" + std::to_string(rank)));
}

TEST_CASE("--help says where defaults come from", "[e2e][pet]") {
  auto h = run(e2e::ddprun({"--help"}));
  CHECK(h.status == 0);
  CHECK_THAT(h.out, Catch::Contains("An option not given takes its value from PET_<OPTION>, as under torchrun"));
}
