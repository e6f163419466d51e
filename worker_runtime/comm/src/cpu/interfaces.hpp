// Which network interface the CPU backend's TCP mesh uses: DDP_SOCKET_IFNAME, in
// the syntax of Gloo's GLOO_SOCKET_IFNAME and NCCL's NCCL_SOCKET_IFNAME.
//
//   eth          interfaces whose names start with "eth" (eth0, eth1, ...)
//   eth0,ib      names starting with any of the listed prefixes
//   =eth1        exactly these names ("=eth1,eth2")
//   ^docker,lo   every interface but those starting with these ("^=..." for exact
//                names); a loopback interface is never picked this way, only by name
//
// The mesh is IPv4 (its listener and endpoints are), so only IPv4 addresses count.
// Of the interfaces the spec admits, the first in the kernel's index order (as
// `ip link` lists them) that is up and has an IPv4 address wins; its first IPv4
// address is the one the mesh binds and advertises.
#pragma once

#include <string>
#include <vector>

namespace ddp::cpu {

// One interface as the kernel lists it.
struct NetInterface {
  std::string name;
  unsigned index = 0;     // the kernel's interface index: the order candidates are tried in
  bool up = false;        // IFF_UP
  bool loopback = false;  // IFF_LOOPBACK
  std::string ipv4;       // its first IPv4 address, dotted; empty when it has none
};

// A DDP_SOCKET_IFNAME value, parsed.
struct InterfaceSpec {
  std::vector<std::string> names;  // prefixes, or whole names when `exact`
  bool exclude = false;            // "^": every interface but the listed ones
  bool exact = false;              // "=": whole names, not prefixes

  // Throws Error naming `text` when it lists no name ("^", "=", ",").
  static InterfaceSpec parse(const std::string& text);
  // Whether the spec admits an interface of this name (exclusion applied).
  bool admits(const NetInterface& interface) const;
};

// This host's interfaces (getifaddrs), in index order. Throws Error when they
// cannot be read.
std::vector<NetInterface> list_interfaces();

// The interface `spec` (a DDP_SOCKET_IFNAME value) picks among `interfaces` (see the
// top of this file). Throws Error naming the spec and every interface there is, with
// its address or why it does not count, when none is admitted, up and has IPv4.
NetInterface pick_interface(const std::string& spec, const std::vector<NetInterface>& interfaces);

}  // namespace ddp::cpu
