// Element types, reduction operators and the buffer view every collective takes.
//
// A Buffer is a non-owning view: a pointer, an element count and a dtype (and the
// device the memory lives on). Collectives never allocate or resize user memory;
// they read and write exactly `count` elements of the views they are given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

namespace ddp {

// Base of every error the worker runtime throws; what() is one line fit for a user.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller broke an API contract (mismatched sizes, bad root, wrong dtype...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Ranks of a group made different calls at the same point: another op, count,
// dtype, reduce op or root, or a skipped call (another sequence number). what()
// names both sides ("rank 0: all_reduce #3 262144×f32 sum; rank 1: all_gather #3
// 1048576×f32") and is the same on every rank of the group.
class Mismatch : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A collective did not finish within its timeout (a peer is alive but stuck, or
// the caller's wait() timeout passed).
class Timeout : public Error {
 public:
  using Error::Error;
};

// A peer process died or its connection dropped. `rank()` is the peer's rank in
// the group where it was noticed; what() names it.
class PeerError : public Error {
 public:
  PeerError(int rank, const std::string& what) : Error(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

enum class DType : uint8_t { F32, F64, F16, BF16, I32, I64, U8 };

// Size of one element in bytes.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::U8: return 1;
  }
  return 1;
}
const char* dtype_name(DType t);  // "f32", "bf16", ...

// Avg sums then divides by the group size (integer types: truncating division).
enum class ReduceOp : uint8_t { Sum, Avg, Min, Max, Prod };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", ...

// IEEE half and bfloat16 as plain 16-bit storage (converted to float to compute).
struct Half { uint16_t bits = 0; };
struct BFloat16 { uint16_t bits = 0; };
float to_float(Half h);
float to_float(BFloat16 b);
Half to_half(float f);          // round to nearest even
BFloat16 to_bfloat16(float f);  // round to nearest even

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };

enum class Device : uint8_t { Cpu, Cuda };
const char* device_name(Device d);  // "cpu" or "cuda"

struct Buffer {
  void* data = nullptr;
  size_t count = 0;  // elements, not bytes
  DType dtype = DType::F32;
  Device device = Device::Cpu;

  size_t bytes() const { return count * dtype_size(dtype); }
  // The elements [offset, offset + n) as a view of the same memory.
  Buffer slice(size_t offset, size_t n) const {
    return Buffer{static_cast<char*>(data) + offset * dtype_size(dtype), n, dtype, device};
  }
};

// A view of a typed host span: ddp::view(std::span<float>(v)).
template <typename T>
Buffer view(std::span<T> s) {
  return Buffer{const_cast<std::remove_const_t<T>*>(s.data()), s.size(), dtype_of<std::remove_const_t<T>>::value,
                Device::Cpu};
}
template <typename Container>
Buffer view(Container& c) {
  return view(std::span(c.data(), c.size()));
}

}  // namespace ddp
