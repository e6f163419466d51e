// Choosing the TCP mesh's interface from DDP_SOCKET_IFNAME (see interfaces.hpp).
#include "interfaces.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "ddp/types.hpp"

namespace ddp::cpu {
namespace {

constexpr const char* kVariable = "DDP_SOCKET_IFNAME";

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// "lo (127.0.0.1), eth0 (down), eth1 (no IPv4 address)": what the error shows.
std::string describe(const std::vector<NetInterface>& interfaces) {
  std::string text;
  for (const auto& i : interfaces) {
    if (!text.empty()) text += ", ";
    text += i.name + " (" + (!i.up ? "down" : i.ipv4.empty() ? "no IPv4 address" : i.ipv4) + ")";
  }
  return text.empty() ? "none" : text;
}

}  // namespace

InterfaceSpec InterfaceSpec::parse(const std::string& text) {
  InterfaceSpec spec;
  std::string rest = text;
  // NCCL's order: "^" first, then "=".
  if (starts_with(rest, "^")) {
    spec.exclude = true;
    rest.erase(0, 1);
  }
  if (starts_with(rest, "=")) {
    spec.exact = true;
    rest.erase(0, 1);
  }
  size_t from = 0;
  while (from <= rest.size()) {
    size_t comma = rest.find(',', from);
    if (comma == std::string::npos) comma = rest.size();
    if (comma > from) spec.names.push_back(rest.substr(from, comma - from));
    from = comma + 1;
  }
  if (spec.names.empty()) {
    throw Error(std::string(kVariable) + "='" + text +
                "' names no interface (expected e.g. eth0, eth,ib, =eth1 or ^docker,lo)");
  }
  return spec;
}

bool InterfaceSpec::admits(const NetInterface& interface) const {
  const bool listed = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
    return exact ? interface.name == n : starts_with(interface.name, n);
  });
  // "^docker" means "a real interface that is not docker": loopback only by name.
  if (exclude) return !listed && !interface.loopback;
  return listed;
}

std::vector<NetInterface> list_interfaces() {
  ifaddrs* head = nullptr;
  if (::getifaddrs(&head) != 0) {
    throw Error(std::string("cannot list this host's network interfaces for ") + kVariable + ": " +
                std::strerror(errno));
  }
  std::map<std::string, NetInterface> by_name;
  for (const ifaddrs* a = head; a != nullptr; a = a->ifa_next) {
    if (a->ifa_name == nullptr) continue;
    NetInterface& i = by_name[a->ifa_name];
    i.name = a->ifa_name;
    i.up = (a->ifa_flags & IFF_UP) != 0;
    i.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
    if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET && i.ipv4.empty()) {
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) i.ipv4 = text;
    }
  }
  ::freeifaddrs(head);
  std::vector<NetInterface> out;
  for (auto& [name, i] : by_name) {
    i.index = ::if_nametoindex(name.c_str());  // 0 for an alias label (eth0:1): last
    out.push_back(std::move(i));
  }
  std::stable_sort(out.begin(), out.end(), [](const NetInterface& a, const NetInterface& b) {
    return (a.index == 0 ? ~0u : a.index) < (b.index == 0 ? ~0u : b.index);
  });
  return out;
}

NetInterface pick_interface(const std::string& spec_text, const std::vector<NetInterface>& interfaces) {
  const InterfaceSpec spec = InterfaceSpec::parse(spec_text);
  for (const auto& i : interfaces) {
    if (spec.admits(i) && i.up && !i.ipv4.empty()) return i;
  }
  throw Error(std::string(kVariable) + "='" + spec_text +
              "' matches no interface that is up with an IPv4 address; this host has: " + describe(interfaces));
}

}  // namespace ddp::cpu
