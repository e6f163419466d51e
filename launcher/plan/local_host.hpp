// Which hosts of a --hostfile/--hosts list are this machine (their agent is a plain
// child process, no ssh), and which of this machine's addresses the other hosts
// reach it at (where the launcher's store listens).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ddprun {

// True for localhost, 127.0.0.0/8, ::1, this machine's host name (short or full), and
// any address of one of its interfaces. A name is not resolved through DNS: a name
// that merely resolves here (e.g. through /etc/hosts to another address) is remote.
bool is_local_host(const std::string& host);

// The addresses of this machine's interfaces (getifaddrs), IPv4 and IPv6, as text.
std::vector<std::string> interface_addresses();

// The addresses `host` resolves to now (getaddrinfo), as text; empty when it does not
// resolve (yet), or the resolver has not answered within kHostLookupBound: a lost DNS
// reply must not hold the launcher for the resolver's own timeout. The store client's
// connect tries then wait on the same lookup (rdzv/resolve.hpp), within the join budget.
inline constexpr std::chrono::milliseconds kHostLookupBound{2000};
std::vector<std::string> resolve_addresses(const std::string& host);

// This machine's host name (gethostname), or "localhost" when it has none.
std::string local_hostname();

// This machine's source address on the route to `host` (IPv4): what the kernel would
// put in a packet sent there. No packet is sent (a UDP socket is connected, then
// asked its local address). Throws LaunchError when the host does not resolve or no
// route leads to it.
std::string source_address_towards(const std::string& host);

}  // namespace ddprun
