#include "reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ddp::cpu {
namespace {

struct Sum { template <typename T> static T apply(T a, T b) { return a + b; } };
struct Prod { template <typename T> static T apply(T a, T b) { return a * b; } };
struct Min { template <typename T> static T apply(T a, T b) { return std::min(a, b); } };
struct Max { template <typename T> static T apply(T a, T b) { return std::max(a, b); } };

// Plain arithmetic types: simple loops the compiler vectorises.
template <typename T, typename Op>
void kernel(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(Op::apply(a[i], b[i]));
}

// Integer sums and products wrap (two's complement), as on a GPU; done in unsigned
// arithmetic so the wrap is defined behaviour.
template <>
void kernel<int32_t, Sum>(int32_t* dst, const int32_t* a, const int32_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<int32_t>(static_cast<uint32_t>(a[i]) + static_cast<uint32_t>(b[i]));
}
template <>
void kernel<int64_t, Sum>(int64_t* dst, const int64_t* a, const int64_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<int64_t>(static_cast<uint64_t>(a[i]) + static_cast<uint64_t>(b[i]));
}
template <>
void kernel<int32_t, Prod>(int32_t* dst, const int32_t* a, const int32_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<int32_t>(static_cast<uint32_t>(a[i]) * static_cast<uint32_t>(b[i]));
}
template <>
void kernel<int64_t, Prod>(int64_t* dst, const int64_t* a, const int64_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<int64_t>(static_cast<uint64_t>(a[i]) * static_cast<uint64_t>(b[i]));
}

// 16-bit floats compute in float and round once per element.
template <typename H, typename Op>
void kernel16(H* dst, const H* a, const H* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float r = Op::apply(to_float(a[i]), to_float(b[i]));
    if constexpr (std::is_same_v<H, Half>) dst[i] = to_half(r);
    else dst[i] = to_bfloat16(r);
  }
}

template <typename Op>
void dispatch_type(DType t, void* dst, const void* a, const void* b, size_t n) {
  switch (t) {
    case DType::F32: return kernel<float, Op>(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b), n);
    case DType::F64: return kernel<double, Op>(static_cast<double*>(dst), static_cast<const double*>(a), static_cast<const double*>(b), n);
    case DType::I32: return kernel<int32_t, Op>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a), static_cast<const int32_t*>(b), n);
    case DType::I64: return kernel<int64_t, Op>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), n);
    case DType::U8: return kernel<uint8_t, Op>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), n);
    case DType::F16: return kernel16<Half, Op>(static_cast<Half*>(dst), static_cast<const Half*>(a), static_cast<const Half*>(b), n);
    case DType::BF16: return kernel16<BFloat16, Op>(static_cast<BFloat16*>(dst), static_cast<const BFloat16*>(a), static_cast<const BFloat16*>(b), n);
  }
}

// The divisor stays in a wide type: cast to the element type, a world of 256 would
// divide a u8 by zero (and 257 by one).
template <typename T>
void divide_typed(T* p, size_t n, int d) {
  using Wide = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
  if constexpr (std::is_floating_point_v<T>) {
    // A power-of-two world: x * (1/d) is the exact x/d, rounded once, as the division
    // (1/d is exact), and a multiply is several times cheaper than a divide (Avg
    // divides every reduced gradient).
    if (d > 0 && (d & (d - 1)) == 0) {
      const T inv = T(1) / static_cast<T>(d);
      for (size_t i = 0; i < n; ++i) p[i] *= inv;
      return;
    }
  }
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<Wide>(p[i]) / static_cast<Wide>(d));
}

}  // namespace

void reduce_into(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return dispatch_type<Sum>(t, dst, a, b, n);
    case ReduceOp::Prod: return dispatch_type<Prod>(t, dst, a, b, n);
    case ReduceOp::Min: return dispatch_type<Min>(t, dst, a, b, n);
    case ReduceOp::Max: return dispatch_type<Max>(t, dst, a, b, n);
  }
}

void reduce_inplace(DType t, ReduceOp op, void* dst, const void* src, size_t n) { reduce_into(t, op, dst, dst, src, n); }

namespace {
// bf16 -> f32 is a shift of the bits: written on the raw 16-bit words so it vectorises.
template <bool Add>
void widen_bf16(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = uint32_t{src[i]} << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    if constexpr (Add) dst[i] += f;
    else dst[i] = f;
  }
}
}  // namespace

void widen_into(DType t, float* dst, const void* src, size_t n, bool add) {
  if (t == DType::BF16) {
    const auto* words = static_cast<const uint16_t*>(src);
    return add ? widen_bf16<true>(dst, words, n) : widen_bf16<false>(dst, words, n);
  }
  const auto* h = static_cast<const Half*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = add ? dst[i] + to_float(h[i]) : to_float(h[i]);
}

void divide(DType t, void* buf, size_t n, int d) {
  switch (t) {
    case DType::F32: return divide_typed(static_cast<float*>(buf), n, d);
    case DType::F64: return divide_typed(static_cast<double*>(buf), n, d);
    case DType::I32: return divide_typed(static_cast<int32_t*>(buf), n, d);
    case DType::I64: return divide_typed(static_cast<int64_t*>(buf), n, d);
    case DType::U8: return divide_typed(static_cast<uint8_t*>(buf), n, d);
    case DType::F16: {
      auto* p = static_cast<Half*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = to_half(to_float(p[i]) / static_cast<float>(d));
      return;
    }
    case DType::BF16: {
      auto* p = static_cast<BFloat16*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = to_bfloat16(to_float(p[i]) / static_cast<float>(d));
      return;
    }
  }
}

}  // namespace ddp::cpu
