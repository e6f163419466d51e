// The NCCL double's transport: one POSIX shared-memory segment per communicator,
// named from the unique id's bytes, that every rank maps (processes or threads).
//
// Layout: a slot per rank (joined flag, pid, device, host identity, its bell, its
// split proposals) and a channel per ordered pair of ranks (a single-producer,
// single-consumer byte ring of kChannelBytes). Operations only ever push bytes into
// a peer's channel or pop bytes from their own, so any buffer size works with a
// bounded segment.
//
// Waiting: a rank's bell is a counter that every change meant for it bumps (bytes
// pushed to it, space freed in a channel it writes, a peer joined or proposed a
// split, its own abort). A waiter reads the bell, tries to progress, and when it
// cannot, sleeps on the bell with a futex (shared between processes) until it
// changes. Nothing spins: a waiter costs no CPU while it waits.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gpu_double::nccl {

constexpr size_t kChannelBytes = 256 * 1024;

// One rank's proposal for a split; two alternate by generation parity (a rank can
// be at most one split ahead of the slowest).
struct SplitProposal {
  std::atomic<uint64_t> generation;  // the split's number (1, 2, ...); 0: none yet
  int32_t color;
  int32_t key;
};

struct alignas(64) Slot {
  std::atomic<uint32_t> joined;    // 1 once the fields below are written
  std::atomic<uint32_t> bell;      // bumped by every change meant for this rank
  std::atomic<uint32_t> sleepers;  // waiters asleep on the bell (wake only if any)
  int32_t pid;
  int32_t device;
  uint64_t host;                   // which host (see host_identity())
  SplitProposal split[2];
};

// Identifies this host: the hostname and the network namespace, so that processes in
// separate network namespaces (the project's multi-node tests) count as hosts of
// their own.
uint64_t host_identity();

// Unlinks the segments in /dev/shm whose every joined rank is a process that no
// longer exists (SIGKILLed before all ranks joined, so nobody unlinked them).
void collect_stale_segments();

// "gpu_double_<32 hex digits>" from the 128 id bytes.
std::string segment_name(const char* id_bytes, size_t size);

class Segment {
 public:
  // Opens the segment `name` for `nranks`, creating it if this rank is first.
  // nullptr (and errno) on failure.
  static std::unique_ptr<Segment> open(const std::string& name, int nranks);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int nranks() const { return nranks_; }
  const std::string& name() const { return name_; }
  Slot& slot(int rank);

  // Copies up to `bytes` into the channel from -> to; returns how many fit.
  size_t push(int from, int to, const uint8_t* data, size_t bytes);
  // Copies up to `bytes` out of the channel from -> to; returns how many there were.
  size_t pop(int from, int to, uint8_t* data, size_t bytes);

  // Bumps `rank`'s bell and wakes its sleepers.
  void ring(int rank);
  void ring_all();
  // Sleeps until `rank`'s bell differs from `seen` (or a bounded while passed, a
  // safety net only: every change rings).
  void sleep(int rank, uint32_t seen);

  // Removes the name (idempotent); the mapping stays valid.
  void unlink();

 private:
  struct Channel;
  Segment(std::string name, int nranks, void* base, size_t size);
  Channel& channel(int from, int to);

  std::string name_;
  int nranks_;
  uint8_t* base_;
  size_t size_;
  std::atomic<bool> unlinked_{false};
};

// Waits on one rank's bell: call seen() before looking at the shared state, then
// idle() when nothing moved; a few yields first, then futex sleeps.
class Waiter {
 public:
  Waiter(Segment& segment, int rank) : segment_(segment), rank_(rank) {}
  uint32_t seen() { return seen_ = segment_.slot(rank_).bell.load(std::memory_order_acquire); }
  void idle();
  void reset() { spins_ = 0; }

 private:
  Segment& segment_;
  int rank_;
  uint32_t seen_ = 0;
  int spins_ = 0;
};

}  // namespace gpu_double::nccl
