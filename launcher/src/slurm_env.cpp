#include "slurm_env.hpp"

#include <cstdlib>
#include <stdexcept>

#include "ddp/slurm.hpp"
#include "errors.hpp"
#include "parse_util.hpp"

namespace ddprun {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

long env_number(const char* name, long fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  auto n = parse_integer(v);
  if (!n || *n < 0) throw LaunchError(std::string(name) + "='" + v + "' is not a number");
  return static_cast<long>(*n);
}

}  // namespace

std::vector<std::string> apply_slurm_step(LaunchOptions& o, const ExplicitFlags& given) {
  if (env("SLURM_JOB_ID") == nullptr || env("SLURM_STEP_ID") == nullptr) return {};
  std::vector<std::string> notes;
  const long job = env_number("SLURM_JOB_ID", 0);
  const long step = env_number("SLURM_STEP_ID", 0);
  const char* nodes_var = env("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  const long nnodes = env_number(nodes_var, 1);
  const long node_id = env_number("SLURM_NODEID", 0);

  if (!given.nnodes && nnodes >= 1) {
    o.nnodes = static_cast<int>(nnodes);
    notes.push_back("nnodes=" + std::to_string(nnodes) + " from " + nodes_var);
  }
  if (!given.node_rank) {
    if (node_id >= o.nnodes) {
      throw LaunchError("SLURM_NODEID=" + std::to_string(node_id) + " is not below the node count " +
                        std::to_string(o.nnodes));
    }
    o.node_rank = static_cast<int>(node_id);
    notes.push_back("node_rank=" + std::to_string(node_id) + " from SLURM_NODEID");
  }
  // srun's default for a multi-node step is one task per node; more would start two
  // ddprun agents claiming the same node rank.
  const char* per_node = env("SLURM_STEP_TASKS_PER_NODE");
  if (per_node != nullptr) {
    int here = 1;
    try {
      here = ddp::slurm::tasks_on_node(per_node, static_cast<int>(node_id));
    } catch (const std::invalid_argument& e) {
      throw LaunchError(e.what());
    }
    if (here > 1 && !given.node_rank) {
      throw UsageError("this Slurm step runs " + std::to_string(here) +
                       " tasks on this node; run one ddprun per node (srun --ntasks-per-node=1 ddprun ...) "
                       "and let --nproc_per_node start the workers");
    }
  }
  if (!given.master_addr && o.nnodes > 1) {
    const char* list_var = env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    const char* list = env(list_var);
    if (list == nullptr) throw LaunchError("in a Slurm step but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set");
    try {
      o.master_addr = ddp::slurm::expand_hostlist(list).front();
    } catch (const std::invalid_argument& e) {
      throw LaunchError(std::string(list_var) + ": " + e.what());
    }
    notes.push_back("master_addr=" + o.master_addr + " (first host of " + list_var + "=" + list + ")");
  }
  if (!given.master_port) {
    o.master_port = ddp::slurm::rendezvous_port(job, step);
    notes.push_back("master_port=" + std::to_string(*o.master_port) + " (from job " + std::to_string(job) +
                    ", step " + std::to_string(step) + ")");
  }
  if (!given.run_id) {
    o.run_id = "slurm-" + std::to_string(job) + "." + std::to_string(step);
    notes.push_back("run id " + o.run_id);
  }
  return notes;
}

}  // namespace ddprun
