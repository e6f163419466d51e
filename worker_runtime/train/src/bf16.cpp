// round_to_bf16: f32 gradients rounded to bf16 for the wire, bit for bit
// what ddp::to_bfloat16 gives, written branch-free so the compiler vectorises it (a
// 16.8 MB bucket is rounded on the training thread as soon as it is complete).
#include "ddp/bf16.hpp"

#include <cstdint>
#include <cstring>

namespace ddp {

void round_to_bf16(const float* src, BFloat16* dst, size_t n) {
  static_assert(sizeof(BFloat16) == sizeof(uint16_t));
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], sizeof u);
    // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit.
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    // NaN stays NaN (quietened), as to_bfloat16; rounding could carry it into inf.
    const uint32_t quiet = (u >> 16) | 0x40u;
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    dst[i].bits = static_cast<uint16_t>(nan ? quiet : rounded);
  }
}

}  // namespace ddp
