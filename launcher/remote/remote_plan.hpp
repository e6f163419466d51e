// The launch from one command, as ddprun -v describes it before starting the agents.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/launch_options.hpp"
#include "remote/hosts.hpp"

namespace ddprun {

// What ddprun -v prints on the launcher before starting the agents: each node's rank,
// host, worker count (and where it came from) and CUDA_VISIBLE_DEVICES, the agent
// command, and every variable sent as NAME=value (control characters escaped).
// Ends with a newline.
std::string describe_remote_plan(const std::vector<HostEntry>& hosts,
                                 const std::vector<std::pair<std::string, std::string>>& env,
                                 const LaunchOptions& options);

}  // namespace ddprun
