// The stamp: a small fixed header at the start of every message of the CPU
// transport, saying which call its sender is running (kind, sequence number,
// count, dtype, reduce op, root). The progress engine reads it before any byte of
// the message is used and compares it with the call the receiving rank runs, so
// ranks that disagree (another op, count, dtype or root, or another sequence
// number) fail instead of exchanging wrong data. Each rank numbers its own calls,
// so a skipped call shows only where the calls it brings together differ.
#pragma once

#include <cstdint>
#include <string>

#include "backend.hpp"

namespace ddp::cpu {

struct Stamp {
  static constexpr uint8_t kMagic = 0xd5;
  static constexpr uint8_t kAllocate = 0xff;  // kind of ProcessGroup::allocate's exchanges

  uint64_t seq = 0;    // detail::Op::seq
  uint64_t count = 0;  // elements each rank moves (see stamp_of)
  int32_t root = -1;   // root; for a send its destination, for a recv its source
  uint8_t kind = 0;    // OpKind, or kAllocate
  uint8_t dtype = 0;
  uint8_t reduce = 0;  // 0 for ops that do not reduce
  uint8_t magic = kMagic;

  bool operator==(const Stamp&) const = default;
};
static_assert(sizeof(Stamp) == 24, "a stamp keeps messages 8-byte aligned");

// The stamp of `op` as this rank runs it: fields every rank of a matching call agrees on.
Stamp stamp_of(const detail::Op& op);
// The stamp of this rank's allocate call.
Stamp allocate_stamp();
// What a peer's message must carry when this rank (group rank `me`) runs `mine`:
// the same call, or for a recv the matching send to `me`.
Stamp expected_from(const Stamp& mine, int me);
// "all_reduce #3 262144×f32 sum", "send #2 4×f32 to 1", "allocate".
std::string describe(const Stamp& s);

}  // namespace ddp::cpu
