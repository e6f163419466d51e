// Single-copy access to a local peer's memory (process_vm_readv/writev, "CMA"):
// what the direct all-reduce uses when ranks of one host may read each other.
// The mesh finds out at formation whether they may (the same answer on every
// rank of a host) and holds one of these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ddp::cpu {

class PeerMemory {
 public:
  PeerMemory() = default;
  // pids: by group rank; permitted: every rank of this host may read every other.
  PeerMemory(std::vector<int> pids, bool permitted) : pids_(std::move(pids)), permitted_(permitted) {}

  // True when every rank of this host found reads permitted at group formation.
  bool permitted() const { return permitted_; }
  // Copies `bytes` from address `remote` in local peer `peer`'s memory to `local`.
  // Throws PeerLost when the peer is gone.
  void read(int peer, uint64_t remote, void* local, size_t bytes) const;
  // The other way (process_vm_writev): `bytes` from `local` to `remote` in `peer`.
  void write(int peer, uint64_t remote, const void* local, size_t bytes) const;

  // Formation: the address of a known value in this process, which peers read
  // to learn whether single-copy reads are allowed (ptrace policy, seccomp,
  // containers), and that probe against process `pid`.
  static uint64_t probe_address();
  static bool probe(int pid, uint64_t probe_address);

 private:
  void copy(int peer, uint64_t remote, std::byte* local, size_t bytes, bool write) const;

  std::vector<int> pids_;
  bool permitted_ = false;
};

}  // namespace ddp::cpu
