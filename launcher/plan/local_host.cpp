#include "plan/local_host.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "errors.hpp"
#include "rdzv/resolve.hpp"

namespace ddprun {
namespace {

// The text form of an interface address, IPv4 or IPv6.
std::string address_text(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof(text));
  }
  return text;
}

bool is_interface_address(const std::string& host) {
  const std::vector<std::string> mine = interface_addresses();
  return std::find(mine.begin(), mine.end(), host) != mine.end();
}

}  // namespace

std::vector<std::string> interface_addresses() {
  std::vector<std::string> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6)) {
      found.push_back(address_text(i->ifa_addr));
    }
  }
  freeifaddrs(list);
  return found;
}

std::vector<std::string> resolve_addresses(const std::string& host) {
  std::vector<std::string> addresses;
  const rdzv::Resolved found = rdzv::resolve(host, std::chrono::steady_clock::now() + kHostLookupBound);
  for (const addrinfo* a = found.addresses.get(); a != nullptr; a = a->ai_next) {
    std::string text = address_text(a->ai_addr);
    if (!text.empty() && std::find(addresses.begin(), addresses.end(), text) == addresses.end()) {
      addresses.push_back(text);
    }
  }
  return addresses;
}

std::string local_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool is_local_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) return true;
  const std::string me = local_hostname();
  if (host == me || host == me.substr(0, me.find('.'))) return true;
  return is_interface_address(host);
}

std::string source_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0) {
    throw LaunchError("cannot resolve host '" + host + "' (to find the address it reaches this machine at; "
                      "--local_addr names it): " + gai_strerror(rc));
  }
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  std::string error;
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (fd < 0) {
    error = std::strerror(errno);
  } else if (connect(fd, found->ai_addr, found->ai_addrlen) != 0 ||
             getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    error = std::strerror(errno);
  }
  freeaddrinfo(found);
  if (fd >= 0) close(fd);
  if (!error.empty()) {
    throw LaunchError("no route to host '" + host + "' (to find the address it reaches this machine at; "
                      "--local_addr names it): " + error);
  }
  return address_text(reinterpret_cast<const sockaddr*>(&local));
}

}  // namespace ddprun
