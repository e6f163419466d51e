// The CPU transport's progress engine: moves many transfers (Xfers) at once over
// the mesh's channels, and is where a failure is noticed and spread (see
// transport.hpp for the terms).
//
// Waiting: run() first spins (when the host has a core per local rank), then
// sleeps on the rank's doorbell (a futex in its own segment that peers bump after
// touching a ring it reads or writes) or in poll() on its sockets. While asleep it
// wakes every few milliseconds to look for dead peers and the deadline.
#pragma once

#include <atomic>
#include <initializer_list>
#include <span>
#include <vector>

#include "channel.hpp"
#include "ddp/types.hpp"
#include "deadline.hpp"

namespace ddp::cpu {

class Mesh;

struct Xfer {
  enum class Kind : uint8_t { Send, Recv, RecvReduce };
  Kind kind = Kind::Send;
  int peer = 0;                   // group rank
  const std::byte* src = nullptr; // Send
  std::byte* dst = nullptr;       // Recv, RecvReduce (dst = op(dst, incoming))
  size_t bytes = 0;
  DType dtype = DType::U8;        // RecvReduce
  ReduceOp op = ReduceOp::Sum;    // RecvReduce
  size_t done = 0;                // bytes moved so far
  bool closed = false;            // message ended on the channel

  static Xfer send(int peer, const void* p, size_t bytes) {
    Xfer x;
    x.kind = Kind::Send, x.peer = peer, x.src = static_cast<const std::byte*>(p), x.bytes = bytes;
    return x;
  }
  static Xfer recv(int peer, void* p, size_t bytes) {
    Xfer x;
    x.kind = Kind::Recv, x.peer = peer, x.dst = static_cast<std::byte*>(p), x.bytes = bytes;
    return x;
  }
  static Xfer recv_reduce(int peer, void* p, size_t count, DType t, ReduceOp op) {
    Xfer x;
    x.kind = Kind::RecvReduce, x.peer = peer, x.dst = static_cast<std::byte*>(p);
    x.bytes = count * dtype_size(t), x.dtype = t, x.op = op;
    return x;
  }
};

// run() gave up: the deadline passed while these peers had not delivered.
struct StuckTimeout {
  std::vector<int> waiting_for;  // group ranks
};

class Progress {
 public:
  // Drives `mesh`'s channels (the mesh must outlive it). spin_us: how long to spin
  // before sleeping; -1: DDP_SPIN_US, or 50 with a core per local rank, else 0.
  Progress(const Mesh& mesh, long spin_us);

  // Moves every transfer to completion. Throws PeerLost or StuckTimeout.
  void run(std::span<Xfer> xfers, Clock::time_point deadline);
  void run(std::initializer_list<Xfer> xfers, Clock::time_point deadline) {
    std::vector<Xfer> v(xfers);
    run(std::span<Xfer>(v), deadline);
  }

  // After a failure: tells local peers (their next wait sees `blamed`) and shuts
  // the sockets so remote peers notice at once. Idempotent.
  void poison(int blamed);
  // Makes the run() in progress (on another thread) throw PeerLost{-1} soon.
  void interrupt();

 private:
  bool step(Xfer& x);
  // Throws when a peer failed or the deadline passed; true when it moved the last
  // bytes of a peer that is gone (the caller goes on).
  bool check_health(std::span<Xfer> xfers, Clock::time_point deadline);
  void sleep(std::span<Xfer> xfers, uint32_t doorbell_seen);

  const Mesh& mesh_;
  std::vector<Channel*> channels_;        // by group rank (the mesh's; null for self)
  SegmentHeader* my_header_ = nullptr;    // this rank's segment (null: no local peer)
  long spin_ns_ = 0;
  Clock::time_point next_health_check_{};
  bool poisoned_ = false;
  std::atomic<bool> interrupted_{false};
};

}  // namespace ddp::cpu
