// The CPU transport's progress engine (see progress.hpp): steps every transfer
// over its channel, spins, then sleeps on the doorbell or the sockets, and looks
// for failed peers and the deadline while it waits.
#include "progress.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "ddp/contract/worker_env.hpp"
#include "mesh.hpp"
#include "reduce.hpp"

namespace ddp::cpu {
namespace {

// Pieces of at most a quarter ring let both sides work at once on a big message.
constexpr size_t kPiece = 256 * 1024;

constexpr auto kHealthEvery = std::chrono::milliseconds(10);
constexpr uint32_t kRoundsPerClockRead = 32;
constexpr auto kSleepSlice = std::chrono::milliseconds(20);

// One idle round of a spin: lets the core's other thread (or the peer's bytes) in.
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int online_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

}  // namespace

Progress::Progress(const Mesh& mesh, long spin_us) : mesh_(mesh), my_header_(mesh.segment(mesh.rank())) {
  channels_.reserve(static_cast<size_t>(mesh.size()));
  for (int r = 0; r < mesh.size(); ++r) channels_.push_back(mesh.channel(r));
  if (spin_us < 0) spin_us = contract::CommSettings::from_environment().spin_us;
  if (spin_us < 0) spin_us = static_cast<int>(mesh.local().size()) <= online_cpus() ? 50 : 0;
  spin_ns_ = spin_us * 1000;
}

void Progress::set_call(const Stamp& call) {
  call_ = call;
  expected_ = expected_from(call, mesh_.rank());
}

// The stamp goes first: written from call_, or read into x.theirs and checked.
// A send's first body piece goes with it (one packet on TCP).
bool Progress::step_stamp(Xfer& x) {
  Channel& ch = *channels_[x.peer];
  const size_t left = sizeof(Stamp) - x.stamped;
  if (x.kind == Xfer::Kind::Send) {
    const size_t n = ch.write_stamped(reinterpret_cast<const std::byte*>(&call_) + x.stamped, left, x.src + x.done,
                                      std::min(kPiece, x.bytes - x.done));
    const size_t stamp = std::min(n, left);
    x.stamped += static_cast<uint32_t>(stamp);
    x.done += n - stamp;
    return n > 0;
  }
  const size_t n = ch.take_stamp(reinterpret_cast<std::byte*>(&x.theirs) + x.stamped, left, x.bytes - x.done);
  x.stamped += static_cast<uint32_t>(n);
  if (x.stamped == sizeof(Stamp) && !(x.theirs == expected_)) {
    throw Mismatched{x.peer, x.theirs};
  }
  return n > 0;
}

// A message not yet begun waits while an earlier one in the same direction
// with the same peer is unfinished: messages must not interleave on a channel.
bool Progress::waits_behind(std::span<Xfer> xfers, size_t i) {
  const Xfer& x = xfers[i];
  const bool out = x.kind == Xfer::Kind::Send;
  for (size_t j = 0; j < i; ++j) {
    const Xfer& y = xfers[j];
    if (!y.closed && y.peer == x.peer && (y.kind == Xfer::Kind::Send) == out) return true;
  }
  return false;
}

bool Progress::step(Xfer& x) {
  bool moved = false;
  if (x.stamped < sizeof(Stamp)) {
    moved = step_stamp(x);
    if (x.stamped < sizeof(Stamp)) return moved;
  }
  Channel& ch = *channels_[x.peer];
  switch (x.kind) {
    case Xfer::Kind::Send: {
      size_t n = ch.write_some(x.src + x.done, std::min(kPiece, x.bytes - x.done));
      x.done += n;
      moved |= n > 0;
      break;
    }
    case Xfer::Kind::Recv: {
      size_t n = ch.read_some(x.dst + x.done, std::min(kPiece, x.bytes - x.done));
      x.done += n;
      moved |= n > 0;
      break;
    }
    case Xfer::Kind::RecvReduce: {
      const size_t esz = dtype_size(x.dtype);
      auto span = ch.peek(std::min(kPiece, x.bytes - x.done));
      const size_t whole = span.size() / esz * esz;
      if (whole > 0) {
        reduce_inplace(x.dtype, x.op, x.dst + x.done, span.data(), whole / esz);
        ch.consume(whole);
        x.done += whole;
        moved = true;
      }
      break;
    }
  }
  if (x.done == x.bytes && !x.closed) {
    if (x.kind == Xfer::Kind::Send) ch.end_send();
    else ch.end_recv();
    x.closed = true;
    moved = true;
  }
  return moved;
}

void Progress::run(std::span<Xfer> xfers, Clock::time_point deadline) {
  if (poisoned_) throw PeerLost{-1, "the group is broken"};
  bool spinning = false;  // idle since the last progress, spinning until spin_until
  bool spun = false;      // that spin is over: look at the health, then sleep
  uint32_t rounds = 0;    // idle rounds of the spin
  Clock::time_point spin_until{};
  for (;;) {
    const uint32_t bell = my_header_ ? my_header_->doorbell.load(std::memory_order_acquire) : 0;
    bool progressed = false;
    bool all_done = true;
    for (size_t i = 0; i < xfers.size(); ++i) {
      Xfer& x = xfers[i];
      if (x.closed) continue;
      if (x.stamped == 0 && i > 0 && waits_behind(xfers, i)) {
        all_done = false;
        continue;
      }
      progressed |= step(x);
      all_done &= x.closed;
    }
    if (all_done) return;
    if (progressed) {
      spinning = spun = false;
      continue;
    }
    // A clock read costs more than an idle round: the spin reads it every few rounds,
    // so a message that arrives is seen within a round.
    if (spinning && !spun && ++rounds % kRoundsPerClockRead != 0) {
      spin_pause();
      continue;
    }
    const auto now = Clock::now();
    if (!spinning) {
      spinning = true;
      spin_until = now + std::chrono::nanoseconds(spin_ns_);
    }
    if (now < spin_until) {
      spin_pause();
      continue;
    }
    spun = true;
    if (now >= next_health_check_) {
      next_health_check_ = now + kHealthEvery;
      if (check_health(xfers, deadline)) {  // a gone peer's last bytes moved
        spinning = spun = false;
        continue;
      }
    }
    sleep(xfers, bell);
  }
}

bool Progress::try_complete(Xfer& x) {
  if (poisoned_) throw PeerLost{-1, "the group is broken"};
  step(x);
  return x.closed;
}

void Progress::sleep(std::span<Xfer> xfers, uint32_t bell) {
  bool shm = false;
  std::vector<pollfd> fds;
  for (auto& x : xfers) {
    if (x.closed) continue;
    const int fd = channels_[x.peer]->fd();
    if (fd < 0) {
      shm = true;
    } else {
      fds.push_back(pollfd{fd, static_cast<short>(x.kind == Xfer::Kind::Send ? POLLOUT : POLLIN), 0});
    }
  }
  if (shm) {
    // Sleep on our doorbell; with sockets pending too, only briefly, then poll them.
    const auto slice = fds.empty() ? kSleepSlice : std::chrono::milliseconds(1);
    timespec ts{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count())};
    my_header_->sleeping.store(1, std::memory_order_seq_cst);
    if (my_header_->doorbell.load(std::memory_order_seq_cst) == bell) {
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&my_header_->doorbell), FUTEX_WAIT, bell, &ts, nullptr, 0);
    }
    my_header_->sleeping.store(0, std::memory_order_relaxed);
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 0);
  } else if (!fds.empty()) {
    ::poll(fds.data(), fds.size(), static_cast<int>(kSleepSlice.count()));
  }
}

void Progress::interrupt() {
  interrupted_.store(true);
  if (my_header_) ring_doorbell(my_header_);
}

bool Progress::check_health(std::span<Xfer> xfers, Clock::time_point deadline) {
  if (interrupted_.load()) throw PeerLost{-1, "aborted"};
  // A local peer that saw a failure first says whom it blames.
  for (int r = 0; r < mesh_.size(); ++r) {
    const SegmentHeader* peer = mesh_.segment(r);
    if (r == mesh_.rank() || !peer) continue;
    const int blamed = peer->failed.load(std::memory_order_acquire);
    if (blamed != 0) throw PeerLost{blamed - 1, "reported by " + mesh_.describe(r)};
  }
  // The peers we wait on: has one died or hung up? (Within a host its pidfd, or its
  // exit as ddprun published it; across hosts its socket, which the exit closes
  // after the last byte it sent.)
  const detail::GroupPeers& peers = mesh_.peers();
  const bool any_exit = peers.exits && peers.exits->generation() != 0;
  for (auto& x : xfers) {
    if (x.closed) continue;
    Channel& ch = *channels_[x.peer];
    if (!ch.peer_gone() && !(any_exit && ch.fd() < 0 && peers.exits->exited(peers.global(x.peer)))) continue;
    // What it sent before it went may still wait to be read: drain before declaring.
    bool moved = false;
    for (size_t j = 0; j < xfers.size(); ++j) {
      Xfer& y = xfers[j];
      if (y.closed || y.peer != x.peer || (y.stamped == 0 && j > 0 && waits_behind(xfers, j))) continue;
      moved |= step(y);  // in message order, as run() moves them
    }
    if (moved) return true;
    throw PeerLost{x.peer, ch.fd() < 0 ? "process exited" : "connection closed"};
  }
  if (Clock::now() >= deadline) {
    StuckTimeout t;
    for (auto& x : xfers)
      if (!x.closed && std::find(t.waiting_for.begin(), t.waiting_for.end(), x.peer) == t.waiting_for.end())
        t.waiting_for.push_back(x.peer);
    throw t;
  }
  return false;
}

void Progress::poison(int blamed) {
  if (poisoned_) return;
  poisoned_ = true;
  if (my_header_ && blamed >= 0) {
    int expected = 0;
    my_header_->failed.compare_exchange_strong(expected, blamed + 1);
    for (int r = 0; r < mesh_.size(); ++r)
      if (r != mesh_.rank() && mesh_.segment(r)) ring_doorbell(mesh_.segment(r));
  }
  for (Channel* ch : channels_)
    if (ch && ch->fd() >= 0) ::shutdown(ch->fd(), SHUT_RDWR);
}

}  // namespace ddp::cpu
