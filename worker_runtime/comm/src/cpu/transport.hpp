// The CPU backend's transport: a channel to every other rank of a group and the
// progress loop that moves many transfers at once.
//
// Terms:
//  - host: ranks that share a boot id and mount/pid namespaces. They talk through
//    POSIX shared memory (one segment per rank, holding a ring per local peer), so
//    no byte crosses a socket. DDP_DISABLE_SHM=1 makes every rank its own host.
//  - mesh: every pair of ranks on different hosts holds one TCP connection
//    (the higher rank connects to the lower one's listener).
//  - transfer (Xfer): one message to or from one peer; a receive may reduce the
//    incoming elements into its destination instead of copying them.
//
// Waiting: run() first spins (when the host has a core per local rank), then
// sleeps on the rank's doorbell (a futex in its own segment that peers bump after
// touching a ring it reads or writes) or in poll() on its sockets. While asleep it
// wakes every few milliseconds to look for dead peers and the deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "channel.hpp"
#include "ddp/process_group.hpp"
#include "ddp/types.hpp"
#include "ddp/work.hpp"
#include "rdzv/store.hpp"

namespace ddp::cpu {

using Clock = std::chrono::steady_clock;

// now + timeout, saturating (a timeout of Millis::max() means no limit).
Clock::time_point deadline_after(Millis timeout);

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

struct TransportOptions {
  std::string advertise_host = "127.0.0.1";  // address peers on other hosts connect to
  Millis connect_timeout{300000};
  size_t ring_bytes = 0;    // per shared-memory ring; 0: DDP_SHM_RING_BYTES, or 8 MiB / local peers in [256 KiB, 4 MiB]
  long spin_us = -1;        // before sleeping; -1: DDP_SPIN_US, or 50 with a core per local rank, else 0
};

class Transport {
 public:
  // Forms the mesh through `store` (keys info/<rank>, shm/<rank>...). Every rank
  // of the group calls it. Throws Error (with the store's reason) on failure.
  Transport(rdzv::Store& store, int rank, int size, const TransportOptions& options);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Hosts in order of their lowest rank; host_of(r) indexes it.
  const std::vector<std::vector<int>>& hosts() const { return hosts_; }
  int host_of(int r) const { return host_of_[r]; }
  std::string describe(int r) const;  // "rank 3 (pid 123 on node-b)"

  // Moves every transfer to completion. Throws PeerLost or StuckTimeout.
  void run(std::span<Xfer> xfers, Clock::time_point deadline);
  void run(std::initializer_list<Xfer> xfers, Clock::time_point deadline) {
    std::vector<Xfer> v(xfers);
    run(std::span<Xfer>(v), deadline);
  }

  // Single-copy reads from a local peer's memory (process_vm_readv): true when every
  // rank of this host found it permitted at group formation (the same answer on all).
  bool can_read_peers() const { return cma_; }
  // Copies `bytes` from address `remote` in local peer `peer`'s memory to `local`.
  // Throws PeerLost when the peer is gone.
  void read_peer(int peer, uint64_t remote, void* local, size_t bytes);
  // The other way (process_vm_writev): `bytes` from `local` to `remote` in `peer`.
  void write_peer(int peer, uint64_t remote, const void* local, size_t bytes);

  // Local rank r's staging area in its shared-memory segment (staging_bytes() long,
  // mapped by every rank of the host; null for ranks elsewhere or a host of one):
  // where large all-reduces of ordinary buffers meet, piece by piece.
  std::byte* staging(int r) const {
    return static_cast<size_t>(r) < staging_.size() ? staging_[static_cast<size_t>(r)] : nullptr;
  }
  static constexpr size_t staging_bytes() { return size_t{1} << 20; }

  // Memory every rank of this host maps (ProcessGroup::allocate): a memfd per rank,
  // which local peers duplicate with pidfd_getfd and map. Every rank of the group
  // calls it in the same order (ranks on other hosts only count the call). Shared
  // only when every local rank mapped every other's; plain memory otherwise. Peers
  // drop their mappings of a freed region at the next share_memory (or the end).
  std::unique_ptr<GroupMemory> share_memory(size_t bytes, Clock::time_point deadline);
  // The id of this rank's live shared region holding [p, p + bytes), or 0.
  uint64_t shared_region_of(const void* p, size_t bytes) const;
  // Where [remote, remote + bytes) of local peer `peer`'s shared region `id` is
  // mapped in this process, or null when it is not.
  std::byte* peer_view(int peer, uint64_t id, uint64_t remote, size_t bytes) const;

  // After a failure: tells local peers (their next wait sees `blamed`) and shuts
  // the sockets so remote peers notice at once. Idempotent.
  void poison(int blamed);
  // Makes the run() in progress (on another thread) throw PeerLost{-1} soon.
  void interrupt();

 private:
  struct Peer;
  bool step(Xfer& x);
  void copy_peer(int peer, uint64_t remote, std::byte* local, size_t bytes, bool write);
  void check_health(std::span<Xfer> xfers, Clock::time_point deadline);
  void sleep(std::span<Xfer> xfers, uint32_t doorbell_seen);
  void form_shm(rdzv::Store& store, Clock::time_point deadline);
  void form_tcp(int listen_fd, uint64_t group_id, Clock::time_point deadline);
  void release();
  void probe_cma(rdzv::Store& store, const std::vector<uint64_t>& probe_addrs, Clock::time_point deadline);

  int rank_;
  int size_;
  TransportOptions options_;
  std::vector<std::unique_ptr<Channel>> channels_;  // by group rank; null for self
  std::vector<int> host_of_;
  std::vector<std::vector<int>> hosts_;
  std::vector<int> pids_;
  std::vector<std::string> hostnames_;
  std::vector<std::string> endpoints_;   // host:port of each rank's listener
  std::vector<std::string> shm_names_;
  std::vector<int> pid_fds_;             // local peers (-1 elsewhere)
  std::vector<std::pair<void*, size_t>> mappings_;
  std::vector<SegmentHeader*> headers_;  // local ranks' segment headers (null elsewhere)
  std::vector<std::byte*> staging_;      // by group rank (null elsewhere)
  SegmentHeader* my_header_ = nullptr;
  bool my_segment_linked_ = false;
  long spin_ns_ = 0;
  Clock::time_point next_health_check_{};
  bool poisoned_ = false;
  bool cma_ = false;
  std::atomic<bool> interrupted_{false};

  // Shared regions (share_memory). Peers' are used under the group's one-operation-
  // at-a-time lock; this rank's own are also dropped by GroupMemory's destructor on
  // any thread, hence the mutex (shared so a region may outlive the transport).
  struct PeerRegion {
    uint64_t base = 0;  // address in the peer
    size_t bytes = 0;
    std::byte* here = nullptr;
  };
  struct OwnRegions {
    std::mutex mu;
    std::map<uint64_t, std::pair<uintptr_t, size_t>> live;  // id -> (address, bytes)
    std::vector<uint64_t> freed;  // since the last share_memory: peers unmap them then
  };
  uint64_t regions_made_ = 0;
  std::vector<std::map<uint64_t, PeerRegion>> peer_regions_;  // by group rank
  std::shared_ptr<OwnRegions> own_regions_ = std::make_shared<OwnRegions>();
};

}  // namespace ddp::cpu
