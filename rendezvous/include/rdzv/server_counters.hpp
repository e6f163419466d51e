// What the store server counts while it runs, for ddp-rendezvous --metrics-port: plain
// counters bumped on the server's one thread and copied out by StoreServer::stats().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace rdzv {

// The wire dialect a connection speaks, known from its first bytes (PROTOCOL.md).
enum class Dialect : uint8_t {
  kDdprun = 0,       // ddprun's framed protocol
  kTorch = 1,        // torch.distributed.TCPStore of PyTorch >= 2.1 (VALIDATE first)
  kTorchLegacy = 2,  // the older dialect of PyTorch 1.13
};
inline constexpr size_t kDialects = 3;

struct ServerCounters {
  // Open connections by dialect, counted once admitted: ddprun's once its HELLO
  // succeeded, torch's once it joined its job's namespace.
  std::array<uint64_t, kDialects> connections_open{};
  std::array<uint64_t, kDialects> connections_total{};  // admitted since start, by dialect
  std::array<uint64_t, 256> ddprun_requests{};          // by wire::Type
  std::array<uint64_t, 64> torch_requests{};            // by torch's query type, 2.x numbering (1.13's mapped onto it)
  uint64_t waits_started = 0;    // requests that blocked (GET/WAIT/MULTI_GET, torch's WAIT)
  uint64_t waits_timed_out = 0;
  uint64_t refused_full = 0;     // connections refused at --max-connections
  uint64_t refused_memory = 0;   // connections, namespaces or requests refused by the memory budget
  uint64_t refused_torch = 0;    // torch connections where none are admitted
  uint64_t auth_failures = 0;    // HELLOs whose proof matched no key
  uint64_t protocol_errors = 0;  // connections closed for malformed input
};

}  // namespace rdzv
