#include "plan/ports.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "errors.hpp"

namespace ddprun {
namespace {

// A socket bound to the wildcard address: dual-stack IPv6 when the host has IPv6,
// else IPv4. Returns the fd (>= 0) or -errno.
int bind_wildcard(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool v6 = fd >= 0;
  if (!v6) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1;
  int zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (v6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  // listen() too: with SO_REUSEADDR a bind can succeed next to a socket that is listening.
  if (rc != 0 || listen(fd, 1) != 0) {
    int err = errno;
    close(fd);
    return -err;
  }
  return fd;
}

}  // namespace

std::string port_unavailable_reason(int port) {
  int fd = bind_wildcard(port);
  if (fd < 0) return std::strerror(-fd);
  close(fd);
  return {};
}

std::string foreign_address_reason(const std::string& address) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    len = sizeof(*v6);
  } else {
    return {};
  }
  // Port 0 and a datagram socket: binding takes nothing from anyone and fails
  // (EADDRNOTAVAIL) exactly when no interface of this host holds the address.
  int fd = socket(addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  const int err = errno;
  close(fd);
  return rc == 0 ? std::string() : std::strerror(err);
}

int pick_free_port() {
  int fd = bind_wildcard(0);
  if (fd < 0) throw LaunchError(std::string("cannot find a free port: ") + std::strerror(-fd));
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int port = -1;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  close(fd);
  if (port <= 0) throw LaunchError("cannot find a free port: getsockname failed");
  return port;
}

}  // namespace ddprun
