// The CPU transport's progress engine: moves many transfers (Xfers) at once over
// the mesh's channels, and is where a failure is noticed and spread (see
// transport.hpp for the terms).
//
// Waiting: run() first spins (when the host has a core per local rank), then
// sleeps on the rank's doorbell (a futex in its own segment that peers bump after
// touching a ring it reads or writes) or in poll() on its sockets. While asleep it
// wakes every few milliseconds to look for dead peers and the deadline.
//
// Every message starts with the stamp of the call its sender runs (stamp.hpp); a
// receive reads it first and throws Mismatched, before using a byte of the message,
// unless it is the stamp this rank expects (see set_call).
#pragma once

#include <atomic>
#include <initializer_list>
#include <span>
#include <vector>

#include "channel.hpp"
#include "ddp/types.hpp"
#include "deadline.hpp"
#include "stamp.hpp"

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
  size_t done = 0;                // bytes moved so far (after the stamp)
  uint32_t stamped = 0;           // bytes of the stamp moved so far
  bool closed = false;            // message ended on the channel
  Stamp theirs;                   // Recv, RecvReduce: the stamp that came

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

// A peer's message carried another call's stamp than this rank expects.
struct Mismatched {
  int peer;      // group rank
  Stamp theirs;  // what that peer runs
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

  // The call this rank runs until the next set_call: what its messages carry and
  // what the peers' must carry (expected_from(call, rank)).
  void set_call(const Stamp& call);
  const Stamp& call() const { return call_; }

  // Moves every transfer to completion; messages to (from) one peer in the order
  // given. Throws PeerLost, StuckTimeout or Mismatched.
  void run(std::span<Xfer> xfers, Clock::time_point deadline);
  void run(std::initializer_list<Xfer> xfers, Clock::time_point deadline) {
    std::vector<Xfer> v(xfers);
    run(std::span<Xfer>(v), deadline);
  }
  // Moves what `x` can move now, without waiting (its channel must carry no
  // unfinished message of the same direction); true once it is complete. Throws
  // PeerLost.
  bool try_complete(Xfer& x);

  // After a failure: tells local peers (their next wait sees `blamed`) and shuts
  // the sockets so remote peers notice at once. Idempotent.
  void poison(int blamed);
  // Makes the run() in progress (on another thread) throw PeerLost{-1} soon.
  void interrupt();

 private:
  bool step(Xfer& x);
  bool step_stamp(Xfer& x);
  static bool waits_behind(std::span<Xfer> xfers, size_t i);
  // Throws when a peer failed or the deadline passed; true when it moved the last
  // bytes of a peer that is gone (the caller goes on).
  bool check_health(std::span<Xfer> xfers, Clock::time_point deadline);
  void sleep(std::span<Xfer> xfers, uint32_t doorbell_seen);

  const Mesh& mesh_;
  std::vector<Channel*> channels_;        // by group rank (the mesh's; null for self)
  SegmentHeader* my_header_ = nullptr;    // this rank's segment (null: no local peer)
  long spin_ns_ = 0;
  Stamp call_;      // this rank's call
  Stamp expected_;  // what peers' messages carry
  Clock::time_point next_health_check_{};
  bool poisoned_ = false;
  std::atomic<bool> interrupted_{false};
};

}  // namespace ddp::cpu
