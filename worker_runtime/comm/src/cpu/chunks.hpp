// Small pieces the CPU algorithm files share (algorithms.cpp, direct.cpp): element
// addresses in a buffer, the n-way split of a buffer into chunks, dividing a chunk
// (Avg), running a batch of transfers until the team's deadline, and whether a team
// lives on one host.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "algorithms.hpp"
#include "reduce.hpp"

namespace ddp::cpu {

inline std::byte* at(Buffer b, size_t element) { return static_cast<std::byte*>(b.data) + element * dtype_size(b.dtype); }

// offsets[i] .. offsets[i+1]: chunk i of `count` elements split n ways.
inline std::vector<size_t> split(size_t count, int n) {
  std::vector<size_t> off(static_cast<size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) off[i] = count * static_cast<size_t>(i) / static_cast<size_t>(n);
  return off;
}

inline void run(Team& t, std::span<Xfer> xs) { t.progress.run(xs, t.deadline); }

inline void divide_chunk(Buffer buf, size_t from, size_t to, int n) {
  if (to > from) divide(buf.dtype, at(buf, from), to - from, n);
}

inline bool one_host(const Team& t) {
  for (int r : t.members)
    if (t.mesh.host_of(r) != t.mesh.host_of(t.members[0])) return false;
  return true;
}

}  // namespace ddp::cpu
