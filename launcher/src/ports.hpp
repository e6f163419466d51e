// TCP port checks for MASTER_PORT: torch-style scripts have rank 0 bind it for their
// store, so ddprun refuses to start when it cannot be bound.
#pragma once

#include <string>

namespace ddprun {

// Returns an empty string when a listening socket can bind `port` on all interfaces
// (as torch's TCPStore does, with SO_REUSEADDR), else the reason (e.g. "Address already in use").
std::string port_unavailable_reason(int port);

// Asks the kernel for a free port (bind to port 0). Throws LaunchError when none is given.
int pick_free_port();

}  // namespace ddprun
