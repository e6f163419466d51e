// TCP port checks for MASTER_PORT: torch-style scripts have rank 0 bind it for their
// store, so ddprun refuses to start when it cannot be bound. And the address check
// for --local_addr: what this node advertises must be one of its own.
#pragma once

#include <string>

namespace ddprun {

// Returns an empty string when a listening socket can bind `port` on all interfaces
// (as torch's TCPStore does, with SO_REUSEADDR), else the reason (e.g. "Address already in use").
std::string port_unavailable_reason(int port);

// Asks the kernel for a free port (bind to port 0). Throws LaunchError when none is given.
int pick_free_port();

// Empty when `address` is an IP address of this host (a socket can bind it) or no IP
// address at all (a host name goes to the other nodes as given, as with torchrun);
// else the reason it is not this host's (e.g. "Cannot assign requested address").
std::string foreign_address_reason(const std::string& address);

}  // namespace ddprun
