// The NCCL double's reductions (see reduce.hpp).
#include "reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace gpu_double::nccl {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// How an element is stored and accumulated. Integers accumulate in their own type,
// with wrap-around for sum and product (done in the unsigned type: no UB).
template <typename T>
struct Plain {
  using Acc = T;
  static Acc load(const uint8_t* p, size_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  }
  static void store(uint8_t* p, size_t i, Acc v) { std::memcpy(p + i * sizeof(T), &v, sizeof(T)); }
};

struct Half {
  using Acc = float;
  static Acc load(const uint8_t* p, size_t i) { return half_to_float(Plain<uint16_t>::load(p, i)); }
  static void store(uint8_t* p, size_t i, Acc v) { Plain<uint16_t>::store(p, i, float_to_half(v)); }
};

struct Bf16 {
  using Acc = float;
  static Acc load(const uint8_t* p, size_t i) { return bf16_to_float(Plain<uint16_t>::load(p, i)); }
  static void store(uint8_t* p, size_t i, Acc v) { Plain<uint16_t>::store(p, i, float_to_bf16(v)); }
};

template <typename A>
A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename A>
A mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    // Promote narrow types to unsigned int so the product wraps instead of overflowing int.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<A>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}

template <typename E, ncclRedOp_t Op>
void reduce_as(const uint8_t* const* in, int n, uint8_t* out, size_t count) {
  using A = typename E::Acc;
  for (size_t i = 0; i < count; ++i) {
    A acc = E::load(in[0], i);
    for (int r = 1; r < n; ++r) {
      const A v = E::load(in[r], i);
      if constexpr (Op == ncclSum || Op == ncclAvg) acc = add(acc, v);
      if constexpr (Op == ncclProd) acc = mul(acc, v);
      if constexpr (Op == ncclMax) acc = std::max(acc, v);
      if constexpr (Op == ncclMin) acc = std::min(acc, v);
    }
    if constexpr (Op == ncclAvg) acc = static_cast<A>(acc / static_cast<A>(n));
    E::store(out, i, acc);
  }
}

template <typename E>
void reduce_type(ncclRedOp_t op, const uint8_t* const* in, int n, uint8_t* out, size_t count) {
  switch (op) {
    case ncclSum: return reduce_as<E, ncclSum>(in, n, out, count);
    case ncclProd: return reduce_as<E, ncclProd>(in, n, out, count);
    case ncclMax: return reduce_as<E, ncclMax>(in, n, out, count);
    case ncclMin: return reduce_as<E, ncclMin>(in, n, out, count);
    case ncclAvg: return reduce_as<E, ncclAvg>(in, n, out, count);
    default: return;
  }
}

}  // namespace

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_half(float f) {
  uint32_t x = float_bits(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00;   // NaN (quiet)
  if (x >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {                       // below 2^-14: a subnormal half
    const float scaled = bits_float(x) * 16777216.0f;  // units of 2^-24, exact
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t mant = x & 0x7fffff;
  uint32_t h = (((x >> 23) - 112) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1) != 0)) ++h;  // a carry moves into the exponent
  return sign | static_cast<uint16_t>(h);
}

float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

size_t dtype_size(ncclDataType_t dtype) {
  switch (dtype) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;  // fp8 and unknown values: refused
  }
}

bool valid_op(ncclRedOp_t op) { return op >= ncclSum && op < ncclNumOps; }

const char* dtype_name(ncclDataType_t dtype) {
  static const char* const names[] = {"int8",    "uint8",   "int32", "uint32",    "int64",    "uint64",
                                      "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return dtype >= 0 && dtype < ncclNumTypes ? names[dtype] : "?";
}

const char* op_name(ncclRedOp_t op) {
  static const char* const names[] = {"sum", "prod", "max", "min", "avg"};
  return valid_op(op) ? names[op] : "?";
}

void reduce(ncclDataType_t dtype, ncclRedOp_t op, const uint8_t* const* in, int n, uint8_t* out, size_t count) {
  switch (dtype) {
    case ncclInt8: return reduce_type<Plain<int8_t>>(op, in, n, out, count);
    case ncclUint8: return reduce_type<Plain<uint8_t>>(op, in, n, out, count);
    case ncclInt32: return reduce_type<Plain<int32_t>>(op, in, n, out, count);
    case ncclUint32: return reduce_type<Plain<uint32_t>>(op, in, n, out, count);
    case ncclInt64: return reduce_type<Plain<int64_t>>(op, in, n, out, count);
    case ncclUint64: return reduce_type<Plain<uint64_t>>(op, in, n, out, count);
    case ncclFloat16: return reduce_type<Half>(op, in, n, out, count);
    case ncclFloat32: return reduce_type<Plain<float>>(op, in, n, out, count);
    case ncclFloat64: return reduce_type<Plain<double>>(op, in, n, out, count);
    case ncclBfloat16: return reduce_type<Bf16>(op, in, n, out, count);
    default: return;
  }
}

}  // namespace gpu_double::nccl
