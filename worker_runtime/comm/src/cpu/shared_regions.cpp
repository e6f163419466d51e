// The CPU transport's shared-region registry (see shared_regions.hpp): offers of
// memfd-backed regions between the ranks of a host, and the lookups the
// algorithms make into them.
#include "shared_regions.hpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <exception>

#include "../group_memory.hpp"
#include "mesh.hpp"
#include "progress.hpp"

namespace ddp::cpu {

RegionRegistry::~RegionRegistry() {
  for (auto& regions : peer_regions_)
    for (auto& [id, v] : regions) ::munmap(v.here, v.bytes);
}

std::unique_ptr<GroupMemory> RegionRegistry::share_memory(size_t bytes, Clock::time_point deadline) {
  const size_t mapped = detail::page_rounded(bytes);
  const uint64_t id = ++regions_made_;  // the same sequence on every rank
  const int me = mesh_.rank();
  const auto ranks = static_cast<size_t>(mesh_.size());
  const auto& local = mesh_.local();
  if (!mesh_.peer_memory().permitted() || local.size() < 2) {  // nobody to share with, or no permission to
    return std::make_unique<detail::MappedMemory>(detail::map_private(mapped), mapped, bytes, false);
  }
  if (peer_regions_.empty()) peer_regions_.resize(ranks);

  // Undone on every way out but success (a peer may die in the exchanges below):
  // our mappings go, and the freed ids we meant to report wait for the next time.
  struct Pending {
    int fd = -1;
    std::byte* data = nullptr;
    size_t mapped = 0;
    std::map<int, PeerRegion> views;
    std::vector<uint64_t> freed;
    std::shared_ptr<OwnRegions> regions;
    ~Pending() {
      if (fd >= 0) ::close(fd);
      if (data) ::munmap(data, mapped);
      for (auto& [r, v] : views) ::munmap(v.here, v.bytes);
      if (!freed.empty()) {
        std::lock_guard lock(regions->mu);
        regions->freed.insert(regions->freed.end(), freed.begin(), freed.end());
      }
    }
  } pending;
  pending.mapped = mapped;
  pending.regions = own_regions_;

  // This rank's pages: a memfd, so peers can map the very same pages.
  struct Offer {
    int64_t fd = -1;
    uint64_t id = 0;
    uint64_t base = 0;
    uint64_t bytes = 0;
    uint64_t freed = 0;  // ids this rank freed since its last offer follow in the second round
  };
  Offer mine;
  std::vector<uint64_t>& freed = pending.freed;
  {
    std::lock_guard lock(own_regions_->mu);
    freed.swap(own_regions_->freed);
  }
  mine.freed = freed.size();
  pending.fd = ::memfd_create("ddp-shared", MFD_CLOEXEC);
  if (pending.fd >= 0 && ::ftruncate(pending.fd, static_cast<off_t>(mapped)) == 0) {
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, pending.fd, 0);
    if (p != MAP_FAILED) pending.data = static_cast<std::byte*>(p);
  }
  // Out of memory is only reported after both rounds, so peers are not left waiting.
  std::exception_ptr no_memory;
  if (pending.data) {
    mine = Offer{pending.fd, id, reinterpret_cast<uintptr_t>(pending.data), mapped, mine.freed};
  } else {
    try {
      pending.data = detail::map_private(mapped);
    } catch (const Error&) {
      no_memory = std::current_exception();
    }
  }

  // Offers out; map what peers offer; then agree, so every rank of the host makes
  // the same choice (all shared or none).
  std::vector<Offer> offers(ranks);
  std::vector<Xfer> xs;
  for (int r : local) {
    if (r == me) continue;
    xs.push_back(Xfer::send(r, &mine, sizeof(mine)));
    xs.push_back(Xfer::recv(r, &offers[static_cast<size_t>(r)], sizeof(Offer)));
  }
  progress_.run(std::span<Xfer>(xs), deadline);
  uint8_t ok = mine.fd >= 0;
  for (int r : local) {
    const Offer& o = offers[static_cast<size_t>(r)];
    if (r == me || !ok) continue;
    if (o.fd < 0 || o.id != id || o.bytes == 0) {
      ok = 0;
      continue;
    }
    const int dup = static_cast<int>(::syscall(SYS_pidfd_getfd, mesh_.pid_fd(r), static_cast<int>(o.fd), 0));
    void* p = dup < 0 ? MAP_FAILED : ::mmap(nullptr, o.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, dup, 0);
    if (dup >= 0) ::close(dup);
    if (p == MAP_FAILED) ok = 0;
    else pending.views[r] = PeerRegion{o.base, o.bytes, static_cast<std::byte*>(p)};
  }
  // Second round: the verdicts, and the regions peers have freed (their pages go
  // once our mappings of them go: this bounds what a freed region costs the host
  // to the time until the next allocate).
  std::vector<uint8_t> verdicts(ranks, 0);
  std::vector<std::vector<uint64_t>> their_freed(ranks);
  xs.clear();
  for (int r : local) {
    if (r == me) continue;
    auto& theirs = their_freed[static_cast<size_t>(r)];
    theirs.resize(std::min<uint64_t>(offers[static_cast<size_t>(r)].freed, regions_made_));
    xs.push_back(Xfer::send(r, &ok, 1));
    xs.push_back(Xfer::recv(r, &verdicts[static_cast<size_t>(r)], 1));
    if (!freed.empty()) xs.push_back(Xfer::send(r, freed.data(), freed.size() * sizeof(uint64_t)));
    if (!theirs.empty()) xs.push_back(Xfer::recv(r, theirs.data(), theirs.size() * sizeof(uint64_t)));
  }
  progress_.run(std::span<Xfer>(xs), deadline);
  freed.clear();  // reported
  for (int r : local) {
    if (r == me) continue;
    auto& regions = peer_regions_[static_cast<size_t>(r)];
    for (uint64_t gone : their_freed[static_cast<size_t>(r)]) {
      if (auto it = regions.find(gone); it != regions.end()) {
        ::munmap(it->second.here, it->second.bytes);
        regions.erase(it);
      }
    }
  }
  // Every peer has mapped our pages or given up: they live on in the mappings.
  if (pending.fd >= 0) ::close(std::exchange(pending.fd, -1));
  if (no_memory) std::rethrow_exception(no_memory);
  bool all = ok;
  for (int r : local) all &= r == me || verdicts[static_cast<size_t>(r)] != 0;
  std::byte* data = std::exchange(pending.data, nullptr);
  if (!all) return std::make_unique<detail::MappedMemory>(data, mapped, bytes, false);
  for (auto& [r, v] : pending.views) peer_regions_[static_cast<size_t>(r)][id] = v;
  pending.views.clear();
  {
    std::lock_guard lock(own_regions_->mu);
    own_regions_->live[id] = {reinterpret_cast<uintptr_t>(data), mapped};
  }
  return std::make_unique<detail::MappedMemory>(data, mapped, bytes, true, [regions = own_regions_, id] {
    std::lock_guard lock(regions->mu);
    regions->live.erase(id);
    regions->freed.push_back(id);
  });
}

uint64_t RegionRegistry::shared_region_of(const void* p, size_t bytes) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(own_regions_->mu);
  for (const auto& [id, region] : own_regions_->live) {
    if (at >= region.first && bytes <= region.second && at - region.first <= region.second - bytes) return id;
  }
  return 0;
}

std::byte* RegionRegistry::peer_view(int peer, uint64_t id, uint64_t remote, size_t bytes) const {
  if (id == 0 || static_cast<size_t>(peer) >= peer_regions_.size()) return nullptr;
  const auto& regions = peer_regions_[static_cast<size_t>(peer)];
  auto it = regions.find(id);
  if (it == regions.end()) return nullptr;
  const PeerRegion& v = it->second;
  if (remote < v.base || bytes > v.bytes || remote - v.base > v.bytes - bytes) return nullptr;
  return v.here + (remote - v.base);
}

}  // namespace ddp::cpu
