// Element-wise reduction kernels of the CPU backend: every dtype x every op.
// Avg reduces with Sum; the caller divides once at the end (divide()).
#pragma once

#include <cstddef>

#include "ddp/types.hpp"

namespace ddp::cpu {

// dst[i] = op(dst[i], src[i]) for i < n. dst and src must not overlap.
void reduce_inplace(DType t, ReduceOp op, void* dst, const void* src, size_t n);
// dst[i] = op(a[i], b[i]); dst may equal a or b, partial overlap is not allowed.
void reduce_into(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t n);
// Widening (a bf16/f16 -> f32 reduce_scatter): dst[i] = float(src[i]) when `add` is
// false, dst[i] += float(src[i]) when true; t is BF16 or F16. The conversion is exact.
void widen_into(DType t, float* dst, const void* src, size_t n, bool add);
// buf[i] /= divisor (truncating for integer types).
void divide(DType t, void* buf, size_t n, int divisor);

}  // namespace ddp::cpu
