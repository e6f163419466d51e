// The launching ddprun of `ddprun --hostfile FILE` / `--hosts`: it hosts the job's store
// (unless --master_addr puts it on node 0), starts one ddprun agent per host (ssh, or a
// child for this machine) with the node's flags on its command line and an AgentHandoff
// (agent_handoff.hpp) on its stdin, relays every node's output to this console, stops
// every node on a stop signal or when one host cannot be started, and exits with the
// job's root cause's status.
#pragma once

#include "cli/options.hpp"

namespace ddprun {

// Runs the whole job from this machine. Returns ddprun's exit status.
int run_remote_launch(const LaunchOptions& options);

}  // namespace ddprun
