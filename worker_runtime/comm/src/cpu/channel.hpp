// A byte stream to one peer rank: shared memory (same host) or TCP (other hosts).
//
// Every call is non-blocking; the progress engine (progress.hpp) drives many channels
// at once and sleeps when none can move. A lost peer makes a call throw PeerLost.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ddp::cpu {

// The peer behind a channel is gone (EOF, reset, or its process died).
struct PeerLost {
  int peer;            // group rank
  std::string detail;  // "connection closed", "process exited", ...
};

class Channel {
 public:
  virtual ~Channel() = default;
  // Copies up to n bytes in; returns how many fit (0: the channel is full for now).
  virtual size_t write_some(const void* p, size_t n) = 0;
  // Copies up to n bytes out; returns how many were available.
  virtual size_t read_some(void* p, size_t n) = 0;
  // As write_some/read_some, but the bytes may become visible to the peer (or their
  // space free) only with the next call that moves bytes or ends the message: a
  // message's stamp costs no extra wake-up.
  virtual size_t stage_some(const void* p, size_t n) { return write_some(p, n); }
  virtual size_t take_some(void* p, size_t n) { return read_some(p, n); }
  // A message's first bytes: up to stamp_n bytes of its stamp, then (once those are
  // all in) up to body_n of its body; returns how many moved in all. TCP sends both
  // in one packet. take_stamp reads only stamp bytes (the body must wait for the
  // stamp's check), but may take up to `body` bytes of what follows off a socket
  // in the same read, for later calls to return.
  virtual size_t write_stamped(const void* stamp, size_t stamp_n, const void* body, size_t body_n) {
    const size_t n = stage_some(stamp, stamp_n);
    return n < stamp_n || body_n == 0 ? n : n + write_some(body, body_n);
  }
  virtual size_t take_stamp(void* p, size_t n, size_t /*body*/) { return take_some(p, n); }
  // Up to `max` readable bytes in place (possibly fewer, possibly none), left
  // unread until consume(); lets a reduction read incoming data without a copy.
  virtual std::span<const std::byte> peek(size_t max) = 0;
  virtual void consume(size_t n) = 0;
  // The end of one message in each direction: both sides call these after the
  // same byte counts, so the shared-memory ring can realign its positions.
  virtual void end_send() {}
  virtual void end_recv() {}
  // TCP: the socket (to poll); shared memory: -1.
  virtual int fd() const { return -1; }
  // True when the peer has gone (checked while waiting; never blocks).
  virtual bool peer_gone() = 0;
};

// ---------------------------------------------------------------------------
// Shared memory
// ---------------------------------------------------------------------------

// The head of each rank's segment. The segment holds this header, then one ring
// per local peer carrying that peer's bytes to this rank.
struct alignas(64) SegmentHeader {
  alignas(64) std::atomic<uint32_t> doorbell;  // bumped by anyone who changed a ring this rank waits on
  alignas(64) std::atomic<uint32_t> sleeping;  // 1 while this rank sleeps on doorbell
  alignas(64) std::atomic<int32_t> failed;     // 1 + group rank blamed for a failure this rank saw, 0: none
  int32_t pid;
  uint32_t rings;
  uint64_t ring_bytes;
};

struct alignas(64) RingControl {
  alignas(64) std::atomic<uint64_t> head;  // bytes written so far (producer)
  alignas(64) std::atomic<uint64_t> tail;  // bytes read so far (consumer)
};

// Bumps a rank's doorbell and wakes it if it sleeps.
void ring_doorbell(SegmentHeader* h);

class ShmChannel final : public Channel {
 public:
  // send_ring/send_data: my ring in the peer's segment; recv_*: the peer's ring in mine.
  ShmChannel(int peer, int peer_pid_fd, SegmentHeader* peer_header, RingControl* send_ring, std::byte* send_data,
             RingControl* recv_ring, std::byte* recv_data, uint64_t ring_bytes);
  size_t write_some(const void* p, size_t n) override;
  size_t read_some(void* p, size_t n) override;
  size_t stage_some(const void* p, size_t n) override;
  size_t take_some(void* p, size_t n) override;
  std::span<const std::byte> peek(size_t max) override;
  void consume(size_t n) override;
  void end_send() override;
  void end_recv() override;
  bool peer_gone() override;

 private:
  int peer_;
  int pid_fd_;
  SegmentHeader* peer_header_;
  RingControl* send_ring_;
  std::byte* send_data_;
  RingControl* recv_ring_;
  std::byte* recv_data_;
  uint64_t cap_;
  uint64_t head_ = 0;         // my write position in send ring (published after each write)
  uint64_t tail_ = 0;         // my read position in recv ring
  uint64_t peer_tail_ = 0;    // last seen tail of send ring (consumer's position)
  uint64_t peer_head_ = 0;    // last seen head of recv ring
  bool staged_ = false;       // head_ moved since it was last published
  bool taken_ = false;        // tail_ moved since it was last published
};

// ---------------------------------------------------------------------------
// TCP
// ---------------------------------------------------------------------------

class TcpChannel final : public Channel {
 public:
  TcpChannel(int peer, int fd);  // takes the connected socket
  ~TcpChannel() override;
  size_t write_some(const void* p, size_t n) override;
  size_t read_some(void* p, size_t n) override;
  size_t write_stamped(const void* stamp, size_t stamp_n, const void* body, size_t body_n) override;
  size_t take_stamp(void* p, size_t n, size_t body) override;
  std::span<const std::byte> peek(size_t max) override;
  void consume(size_t n) override;
  int fd() const override { return fd_; }
  bool peer_gone() override;

 private:
  size_t receive(std::byte* p, size_t n);  // one non-blocking recv; 0: nothing yet
  int peer_;
  int fd_;
  std::vector<std::byte> staging_;  // peek(): bytes received, [begin_, end_) unread
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace ddp::cpu
