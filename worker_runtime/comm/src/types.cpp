#include "ddp/types.hpp"

#include <cmath>
#include <cstring>

namespace ddp {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::Cuda ? "cuda" : "cpu"; }

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Prod: return "prod";
  }
  return "?";
}

static uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float to_float(BFloat16 b) { return bits_float(uint32_t{b.bits} << 16); }

BFloat16 to_bfloat16(float f) {
  uint32_t u = float_bits(f);
  if (std::isnan(f)) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest, ties to even
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

float to_float(Half h) {
  const uint32_t sign = uint32_t{h.bits & 0x8000u} << 16;
  uint32_t exp = (h.bits >> 10) & 0x1f;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: value = mant * 2^-24.
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

Half to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return Half{static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u))};
  }
  if (abs >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal (or zero), value / 2^-24
    // rounded to nearest even.
    float v = bits_float(abs) * 16777216.0f;  // exact: a power-of-two scaling
    float r = std::nearbyint(v);              // default rounding mode: ties to even
    return Half{static_cast<uint16_t>(sign | static_cast<uint16_t>(r))};
  }
  // Normal: rebias the exponent and round the mantissa from 23 to 10 bits.
  uint32_t m = abs - 0x38000000u;  // exponent bias 127 -> 15
  m += 0xfffu + ((m >> 13) & 1u);
  return Half{static_cast<uint16_t>(sign | (m >> 13))};
}

}  // namespace ddp
