// A multi-node launch that names no master address, in an environment that has one:
// a Kubeflow PyTorchJob pod without elasticPolicy gets MASTER_ADDR/MASTER_PORT but no
// PET_MASTER_ADDR, and torchrun, like ddprun, reads only --master_addr/PET_MASTER_ADDR,
// so every node would look for node 0's store on itself. Said at once, instead of
// after --join_timeout.
#pragma once

#include <optional>
#include <string>

#include "cli/launch_options.hpp"

namespace ddprun {

// One warning line when `o` is a static multi-node launch (no --rdzv_endpoint, not a
// --hostfile launcher) without a master address given, and `env_master_addr` (the
// environment's MASTER_ADDR, null when unset) names another host; else nothing.
std::optional<std::string> unused_master_addr_hint(const LaunchOptions& o, const char* env_master_addr);

}  // namespace ddprun
