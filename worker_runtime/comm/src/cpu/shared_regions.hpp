// The CPU transport's shared-region registry: memory every rank of a host maps
// (ProcessGroup::allocate), which regions this rank shares, and where local
// peers' regions are mapped here. The algorithms look regions up through its
// const interface; only the process group's allocate makes new ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "ddp/process_group.hpp"
#include "deadline.hpp"

namespace ddp::cpu {

class Mesh;
class Progress;

class RegionRegistry {
 public:
  // Shares over `mesh`'s local peers, exchanging offers through `progress`
  // (both must outlive it).
  RegionRegistry(const Mesh& mesh, Progress& progress) : mesh_(mesh), progress_(progress) {}
  ~RegionRegistry();
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  // A memfd per rank, which local peers duplicate with pidfd_getfd and map. Every
  // rank of the group calls it in the same order (ranks on other hosts only count
  // the call). Shared only when every local rank mapped every other's; plain
  // memory otherwise. Peers drop their mappings of a freed region at the next
  // share_memory (or the end).
  std::unique_ptr<GroupMemory> share_memory(size_t bytes, Clock::time_point deadline);
  // The id of this rank's live shared region holding [p, p + bytes), or 0.
  uint64_t shared_region_of(const void* p, size_t bytes) const;
  // Where [remote, remote + bytes) of local peer `peer`'s shared region `id` is
  // mapped in this process, or null when it is not.
  std::byte* peer_view(int peer, uint64_t id, uint64_t remote, size_t bytes) const;

 private:
  // Peers' regions are used under the group's one-operation-at-a-time lock; this
  // rank's own are also dropped by GroupMemory's destructor on any thread, hence
  // the mutex (shared so a region may outlive the registry).
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

  const Mesh& mesh_;
  Progress& progress_;
  uint64_t regions_made_ = 0;
  std::vector<std::map<uint64_t, PeerRegion>> peer_regions_;  // by group rank
  std::shared_ptr<OwnRegions> own_regions_ = std::make_shared<OwnRegions>();
};

}  // namespace ddp::cpu
