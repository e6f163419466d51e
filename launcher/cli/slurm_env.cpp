#include "cli/slurm_env.hpp"

#include "ddp/contract/slurm.hpp"
#include "errors.hpp"

namespace ddprun {

std::vector<std::string> apply_slurm_step(LaunchOptions& o, const ExplicitFlags& given) {
  const auto vars = ddp::contract::Variables::from_process();
  // A job step, not just a job: an allocation's shell (salloc, sbatch) runs no step.
  if (!vars.has("SLURM_STEP_ID")) return {};
  const auto step = ddp::contract::slurm::Step::from_variables(vars);
  if (!step) return {};
  std::vector<std::string> notes;
  const long job = step->job_id;
  const long nnodes = step->nnodes;
  const long node_id = step->node_id;
  const std::string& nodes_var = step->nnodes_var;

  if (!given.nnodes && nnodes >= 1) {
    o.nnodes = o.min_nodes = static_cast<int>(nnodes);  // a fixed count: elastic only with --nnodes MIN:MAX
    notes.push_back("nnodes=" + std::to_string(nnodes) + " from " + nodes_var);
  }
  if (!given.node_rank) {
    if (node_id >= o.nnodes) {
      throw LaunchError("SLURM_NODEID=" + std::to_string(node_id) + " is not below the node count " +
                        std::to_string(o.nnodes));
    }
    o.node_rank = static_cast<int>(node_id);
    o.node_rank_given = true;  // an elastic job's order hint: nodes keep Slurm's order
    notes.push_back("node_rank=" + std::to_string(node_id) + " from SLURM_NODEID");
  }
  // srun's default for a multi-node step is one task per node; more would start two
  // ddprun agents claiming the same node rank.
  if (step->tasks_per_node_var == "SLURM_STEP_TASKS_PER_NODE") {
    const int here = step->tasks_on(static_cast<int>(node_id));
    if (here > 1 && !given.node_rank) {
      throw UsageError("this Slurm step runs " + std::to_string(here) +
                       " tasks on this node; run one ddprun per node (srun --ntasks-per-node=1 ddprun ...) "
                       "and let --nproc_per_node start the workers");
    }
  }
  if (!given.master_addr && o.nnodes > 1) {
    o.master_addr = step->first_host();
    notes.push_back("master_addr=" + o.master_addr + " (first host of " + step->nodelist_var + "=" + *step->nodelist +
                    ")");
  }
  if (!given.master_port) {
    o.master_port = ddp::contract::slurm::rendezvous_port(job, step->step_id);
    notes.push_back("master_port=" + std::to_string(*o.master_port) + " (from job " + std::to_string(job) +
                    ", step " + std::to_string(step->step_id) + ")");
  }
  if (!given.run_id) {
    o.run_id = step->run_id();
    notes.push_back("run id " + o.run_id);
  }
  return notes;
}

}  // namespace ddprun
