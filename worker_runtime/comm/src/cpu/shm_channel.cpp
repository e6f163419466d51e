#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "channel.hpp"

namespace ddp::cpu {

void ring_doorbell(SegmentHeader* h) {
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleeping.load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->doorbell), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

ShmChannel::ShmChannel(int peer, int peer_pid_fd, SegmentHeader* peer_header, RingControl* send_ring,
                       std::byte* send_data, RingControl* recv_ring, std::byte* recv_data, uint64_t ring_bytes)
    : peer_(peer),
      pid_fd_(peer_pid_fd),
      peer_header_(peer_header),
      send_ring_(send_ring),
      send_data_(send_data),
      recv_ring_(recv_ring),
      recv_data_(recv_data),
      cap_(ring_bytes) {}

size_t ShmChannel::write_some(const void* p, size_t n) {
  const size_t todo = stage_some(p, n);
  if (todo == 0) return 0;
  send_ring_->head.store(head_, std::memory_order_release);
  staged_ = false;
  ring_doorbell(peer_header_);
  return todo;
}

size_t ShmChannel::stage_some(const void* p, size_t n) {
  if (head_ - peer_tail_ + n > cap_) peer_tail_ = send_ring_->tail.load(std::memory_order_acquire);
  const uint64_t used = head_ - peer_tail_;  // may exceed cap_ by the padding of end_send()
  const uint64_t space = used >= cap_ ? 0 : cap_ - used;
  size_t todo = std::min<uint64_t>(n, space);
  if (todo == 0) return 0;
  const auto* src = static_cast<const std::byte*>(p);
  size_t left = todo;
  while (left > 0) {  // at most two pieces: up to the end of the ring, then from its start
    const uint64_t pos = head_ % cap_;
    const size_t piece = std::min<uint64_t>(left, cap_ - pos);
    std::memcpy(send_data_ + pos, src, piece);
    src += piece;
    left -= piece;
    head_ += piece;
  }
  staged_ = true;
  return todo;
}

std::span<const std::byte> ShmChannel::peek(size_t max) {
  // Reload whenever the cached head cannot satisfy the caller: it may sit inside an
  // element (a reduction then waits for the rest), or behind our tail by the padding
  // end_recv() skipped.
  if (peer_head_ < tail_ + max) peer_head_ = recv_ring_->head.load(std::memory_order_acquire);
  const uint64_t avail = peer_head_ > tail_ ? peer_head_ - tail_ : 0;
  const uint64_t pos = tail_ % cap_;
  const size_t n = std::min<uint64_t>({avail, cap_ - pos, max});
  return {recv_data_ + pos, n};
}

void ShmChannel::consume(size_t n) {
  if (n == 0) return;
  tail_ += n;
  taken_ = false;
  recv_ring_->tail.store(tail_, std::memory_order_release);
  ring_doorbell(peer_header_);  // the producer may wait for space
}

size_t ShmChannel::read_some(void* p, size_t n) {
  const size_t got = take_some(p, n);
  if (got > 0) {
    recv_ring_->tail.store(tail_, std::memory_order_release);
    taken_ = false;
    ring_doorbell(peer_header_);
  }
  return got;
}

size_t ShmChannel::take_some(void* p, size_t n) {
  auto* dst = static_cast<std::byte*>(p);
  size_t got = 0;
  while (got < n) {
    auto span = peek(n - got);
    if (span.empty()) break;
    std::memcpy(dst + got, span.data(), span.size());
    got += span.size();
    tail_ += span.size();
  }
  taken_ |= got > 0;
  return got;
}

// Messages start on 8-byte boundaries so no element straddles the ring's end
// (the ring size is a multiple of 8). Both sides skip the same padding.
void ShmChannel::end_send() {
  if (staged_) {  // a message with nothing after its stamp
    send_ring_->head.store(head_, std::memory_order_release);
    staged_ = false;
    ring_doorbell(peer_header_);
  }
  const uint64_t aligned = (head_ + 7) & ~uint64_t{7};
  if (aligned == head_) return;
  // The padding needs space too; the consumer frees it when it realigns.
  head_ = aligned;
  send_ring_->head.store(head_, std::memory_order_release);
}

void ShmChannel::end_recv() {
  const uint64_t aligned = (tail_ + 7) & ~uint64_t{7};
  if (aligned == tail_ && !taken_) return;
  taken_ = false;
  tail_ = aligned;
  recv_ring_->tail.store(tail_, std::memory_order_release);
  ring_doorbell(peer_header_);
}

bool ShmChannel::peer_gone() {
  if (pid_fd_ < 0) return false;
  pollfd p{pid_fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;  // a pidfd is readable once its process has exited
}

}  // namespace ddp::cpu
