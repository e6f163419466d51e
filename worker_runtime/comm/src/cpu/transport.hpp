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
// Parts, one job each:
//  - Mesh (mesh.hpp): forms the channels through the store and owns them, with
//    the host layout, the shared-memory segments and single-copy peer memory
//    access (PeerMemory, peer_memory.hpp).
//  - Progress (progress.hpp): moves transfers over the mesh, waits, and notices
//    and spreads failures (poison, interrupt).
//  - RegionRegistry (shared_regions.hpp): memory shared across a host and the
//    lookups the algorithms make into it.
// Transport only owns the three, in the order they depend on each other, so the
// process group holds one object; the algorithms see the parts (algorithms.hpp).
#pragma once

#include <memory>
#include <string>

#include "mesh.hpp"
#include "progress.hpp"
#include "shared_regions.hpp"

namespace ddp::cpu {

// The mesh's options (address, connect timeout, ring size) and the engine's.
struct TransportOptions : MeshOptions {
  long spin_us = -1;  // before sleeping; -1: DDP_SPIN_US, or 50 with a core per local rank, else 0
};

class Transport {
 public:
  // Forms the mesh through `store` (keys info/<rank>, shm/<rank>...). Every rank
  // of the group calls it. Throws Error (with the store's reason) on failure.
  Transport(rdzv::Store& store, int rank, int size, const TransportOptions& options)
      : mesh_(store, rank, size, options),
        progress_(mesh_, options.spin_us),
        regions_(mesh_, progress_) {}

  Mesh& mesh() { return mesh_; }
  Progress& progress() { return progress_; }
  RegionRegistry& regions() { return regions_; }

  std::string describe(int r) const { return mesh_.describe(r); }  // "rank 3 (pid 123 on node-b)"
  // See RegionRegistry::share_memory.
  std::unique_ptr<GroupMemory> share_memory(size_t bytes, Clock::time_point deadline) {
    return regions_.share_memory(bytes, deadline);
  }
  // See Progress::poison and Progress::interrupt.
  void poison(int blamed) { progress_.poison(blamed); }
  void interrupt() { progress_.interrupt(); }

 private:
  Mesh mesh_;
  Progress progress_;
  RegionRegistry regions_;
};

}  // namespace ddp::cpu
