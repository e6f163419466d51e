// Facts about a Slurm job step that ddprun (srun ddprun ...) and the worker runtime
// (srun ./train, one task per GPU) read from its environment.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/contract/parse.hpp"

namespace ddp::contract::slurm {

// Expands a Slurm hostlist expression into host names, in order:
//   "node[01-04,07],gpu-a[1-2]" -> node01 node02 node03 node04 node07 gpu-a1 gpu-a2
//   "rack[1-2]-n[1-2]"          -> rack1-n1 rack1-n2 rack2-n1 rack2-n2
// Zero padding follows the range's first number. Throws std::invalid_argument naming
// the problem for a malformed expression or one that expands past `max_hosts`.
std::vector<std::string> expand_hostlist(std::string_view expression, size_t max_hosts = 1'000'000);

// The port a job step's rendezvous store listens on at its first node: derived from the
// job and step ids so steps sharing nodes do not collide, and kept in 10000-29999,
// below Linux's ephemeral port range.
int rendezvous_port(long job_id, long step_id);

// "2(x3),1" (SLURM_TASKS_PER_NODE) -> the count for node `node` (here 2 for nodes 0-2).
// Throws std::invalid_argument for a malformed value or a node past the list.
int tasks_on_node(std::string_view tasks_per_node, int node);

// The variables of the step this process runs in, as srun sets them. Each value
// names the variable it came from, for messages.
struct Step {
  long job_id = 0;                 // SLURM_JOB_ID
  long step_id = 0;                // SLURM_STEP_ID (0 when unset)
  int nnodes = 1;                  // SLURM_STEP_NUM_NODES, else SLURM_NNODES
  std::string nnodes_var;          // which of the two it was
  int node_id = 0;                 // SLURM_NODEID
  std::optional<int> procid;       // SLURM_PROCID: this task's rank in the step
  std::optional<int> ntasks;       // SLURM_NTASKS
  std::optional<int> local_id;     // SLURM_LOCALID
  std::optional<std::string> tasks_per_node;      // SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE
  std::string tasks_per_node_var;
  std::optional<std::string> nodelist;            // SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
  std::string nodelist_var;

  // Nothing outside a job step (SLURM_JOB_ID unset). Throws ContractError for a
  // variable that is set but malformed.
  static std::optional<Step> from_variables(const Variables& vars);

  // The step's first host (where rank 0 and node 0's store run). Throws
  // ContractError when no node list is set or it does not parse.
  std::string first_host() const;
  // Tasks on node `node` from tasks_per_node (1 when unset). Throws ContractError.
  int tasks_on(int node) const;
  // "slurm-<job>.<step>": the run id of the step.
  std::string run_id() const;
};

}  // namespace ddp::contract::slurm
