#include "socket_options.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>

namespace rdzv {

void set_liveness_options(int fd, Millis timeout) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (timeout.count() <= 0) return;
  // Aim at about half the timeout (whole seconds: the kernel's unit), because the
  // kernel overshoots: an idle period, then probes one second apart, and a user
  // timeout that only acts when a probe or retransmission is due. Measured on a
  // cut veth link (3 s timeout): detection in about 3 s.
  int budget = std::max<int>(1, static_cast<int>(timeout.count() / 2000));
  int idle = std::max(1, budget / 2);
  int interval = 1;
  int count = std::max(1, budget - idle);
  unsigned user_timeout = static_cast<unsigned>(std::max<int64_t>(1000, timeout.count() / 2));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
}

}  // namespace rdzv
