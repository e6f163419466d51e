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
  // Probe after half the timeout of silence, then up to 4 probes spread over the
  // other half (whole seconds: the kernel's unit): an unreachable peer is declared
  // dead after about `timeout`.
  int total = std::max<int>(2, static_cast<int>(timeout.count() / 1000));
  int idle = std::max(1, total / 2);
  int count = std::clamp(total - idle, 1, 4);
  int interval = std::max(1, (total - idle) / count);
  unsigned user_timeout = static_cast<unsigned>(timeout.count());  // unacknowledged data
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
}

}  // namespace rdzv
