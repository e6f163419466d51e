// Running inside a Slurm job step (srun ddprun ...): the node count, this node's rank,
// the store host and a per-job port come from Slurm, unless given as flags.
#pragma once

#include <string>
#include <vector>

#include "cli/launch_options.hpp"

namespace ddprun {

// Which of the flags Slurm could supply were given on the command line.
struct ExplicitFlags {
  bool nnodes = false;
  bool node_rank = false;
  bool master_addr = false;
  bool master_port = false;
  bool run_id = false;
};

// When SLURM_JOB_ID and SLURM_STEP_ID are set, fills what the flags left open and
// returns one line per value saying where it came from (empty outside Slurm).
// Throws UsageError for a step that runs more than one ddprun per node, and
// LaunchError for Slurm variables that make no sense.
std::vector<std::string> apply_slurm_step(LaunchOptions& options, const ExplicitFlags& given);

}  // namespace ddprun
