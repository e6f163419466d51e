// Single-copy reads and writes of a local peer's memory (see peer_memory.hpp).
#include "peer_memory.hpp"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "channel.hpp"

namespace ddp::cpu {
namespace {

// A known value at a known address: peers read it with process_vm_readv to learn
// whether single-copy reads are allowed (ptrace policy, seccomp, containers).
const volatile uint64_t kCmaProbe = 0x646470636d617631ull;  // "ddpcmav1"

}  // namespace

uint64_t PeerMemory::probe_address() { return reinterpret_cast<uintptr_t>(&kCmaProbe); }

bool PeerMemory::probe(int pid, uint64_t probe_address) {
  uint64_t value = 0;
  iovec l{&value, sizeof(value)}, rem{reinterpret_cast<void*>(probe_address), sizeof(value)};
  return ::process_vm_readv(pid, &l, 1, &rem, 1, 0) == static_cast<ssize_t>(sizeof(value)) && value == kCmaProbe;
}

void PeerMemory::read(int peer, uint64_t remote, void* local, size_t bytes) const {
  copy(peer, remote, static_cast<std::byte*>(local), bytes, false);
}

void PeerMemory::write(int peer, uint64_t remote, const void* local, size_t bytes) const {
  copy(peer, remote, static_cast<std::byte*>(const_cast<void*>(local)), bytes, true);
}

void PeerMemory::copy(int peer, uint64_t remote, std::byte* local, size_t bytes, bool write) const {
  while (bytes > 0) {
    iovec l{local, bytes}, rem{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = write ? ::process_vm_writev(pids_[peer], &l, 1, &rem, 1, 0)
                            : ::process_vm_readv(pids_[peer], &l, 1, &rem, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      const char* what = write ? "writing" : "reading";
      throw PeerLost{peer, n < 0 ? std::string(what) + " its memory failed: " + std::strerror(errno)
                                 : std::string(what) + " its memory moved nothing"};
    }
    local += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace ddp::cpu
