// write_fully (write_fully.hpp).
#include "supervise/write_fully.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace ddprun {

size_t write_fully(int fd, std::string_view data) {
  size_t written = 0;
  while (written < data.size()) {
    ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // a non-blocking console (set by whoever shares it): wait until it drains
        pollfd p{fd, POLLOUT, 0};
        poll(&p, 1, -1);
        continue;
      }
      return written;
    }
    if (n == 0) {  // nothing taken and no reason given: retrying could spin forever
      errno = EIO;
      return written;
    }
    written += static_cast<size_t>(n);
  }
  return written;
}

}  // namespace ddprun
