#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "channel.hpp"

namespace ddp::cpu {
namespace {
constexpr size_t kStagingBytes = 256 * 1024;  // peek() window of a reduction
}

TcpChannel::TcpChannel(int peer, int fd) : peer_(peer), fd_(fd), staging_(kStagingBytes) {}

TcpChannel::~TcpChannel() {
  if (fd_ >= 0) ::close(fd_);
}

size_t TcpChannel::write_some(const void* p, size_t n) {
  if (n == 0) return 0;
  for (;;) {
    ssize_t r = ::send(fd_, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw PeerLost{peer_, std::string("send failed: ") + std::strerror(errno)};
  }
}

size_t TcpChannel::read_some(void* p, size_t n) {
  if (n == 0) return 0;
  auto* dst = static_cast<std::byte*>(p);
  size_t got = 0;
  if (begin_ < end_) {  // bytes a peek() already took off the socket come first
    got = std::min(n, end_ - begin_);
    std::memcpy(dst, staging_.data() + begin_, got);
    begin_ += got;
    if (got == n) return got;
  }
  for (;;) {
    ssize_t r = ::recv(fd_, dst + got, n - got, MSG_DONTWAIT);
    if (r > 0) return got + static_cast<size_t>(r);
    if (r == 0) throw PeerLost{peer_, "connection closed"};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return got;
    throw PeerLost{peer_, std::string("receive failed: ") + std::strerror(errno)};
  }
}

std::span<const std::byte> TcpChannel::peek(size_t max) {
  const size_t have = end_ - begin_;
  if (have < max && have < staging_.size()) {
    if (begin_ > 0) {  // keep the unread bytes (a partial element) at the front
      std::memmove(staging_.data(), staging_.data() + begin_, have);
      begin_ = 0;
      end_ = have;
    }
    // Never take more than the caller's message holds: the rest belongs to the next one.
    const size_t want = std::min(max, staging_.size()) - have;
    for (;;) {
      ssize_t r = ::recv(fd_, staging_.data() + end_, want, MSG_DONTWAIT);
      if (r > 0) {
        end_ += static_cast<size_t>(r);
        break;
      }
      if (r == 0) throw PeerLost{peer_, "connection closed"};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      throw PeerLost{peer_, std::string("receive failed: ") + std::strerror(errno)};
    }
  }
  return {staging_.data() + begin_, std::min(max, end_ - begin_)};
}

void TcpChannel::consume(size_t n) { begin_ += n; }

bool TcpChannel::peer_gone() {
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

}  // namespace ddp::cpu
