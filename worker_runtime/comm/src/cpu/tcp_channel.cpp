#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "channel.hpp"

namespace ddp::cpu {
namespace {
constexpr size_t kStagingBytes = 256 * 1024;  // peek() window of a reduction
// What take_stamp() reads of a body with its stamp: the small messages whole; a
// large body's rest goes straight to its buffer (without a copy through staging_).
constexpr size_t kReadAhead = 64 * 1024;
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

size_t TcpChannel::write_stamped(const void* stamp, size_t stamp_n, const void* body, size_t body_n) {
  iovec iov[2] = {{const_cast<void*>(stamp), stamp_n}, {const_cast<void*>(body), body_n}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = body_n > 0 ? 2 : 1;
  for (;;) {
    ssize_t r = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw PeerLost{peer_, std::string("send failed: ") + std::strerror(errno)};
  }
}

size_t TcpChannel::receive(std::byte* p, size_t n) {
  for (;;) {
    ssize_t r = ::recv(fd_, p, n, MSG_DONTWAIT);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) throw PeerLost{peer_, "connection closed"};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw PeerLost{peer_, std::string("receive failed: ") + std::strerror(errno)};
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
  return got + receive(dst + got, n - got);
}

size_t TcpChannel::take_stamp(void* p, size_t n, size_t body) {
  if (begin_ == end_) {  // one recv for the stamp and (up to a window) the body after it
    begin_ = end_ = 0;
    end_ = receive(staging_.data(), std::min(n + std::min(body, kReadAhead), staging_.size()));
  }
  const size_t got = std::min(n, end_ - begin_);
  std::memcpy(p, staging_.data() + begin_, got);
  begin_ += got;
  return got;
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
    end_ += receive(staging_.data() + end_, std::min(max, staging_.size()) - have);
  }
  return {staging_.data() + begin_, std::min(max, end_ - begin_)};
}

void TcpChannel::consume(size_t n) { begin_ += n; }

bool TcpChannel::peer_gone() {
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

}  // namespace ddp::cpu
