// Rounding gradients to bf16 for the wire: round to nearest even, as
// ddp::to_bfloat16, over a whole buffer (vectorisable). Reductions of the rounded
// values are done in f32 (ProcessGroup::reduce_scatter bf16 -> f32).
#pragma once

#include <cstddef>

#include "ddp/types.hpp"

namespace ddp {

// dst[i] = to_bfloat16(src[i]) for i < n.
void round_to_bf16(const float* src, BFloat16* dst, size_t n);

}  // namespace ddp
