// device_worker's device memory and values (tests/comm/gpu/device_worker.cpp): a
// cudaMalloc'd buffer with upload/download in any dtype, and the values each rank
// contributes with the reference results they reduce to.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/types.hpp"

namespace device_test {

using ddp::Buffer;
using ddp::DType;
using ddp::ReduceOp;

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// `count` elements of `t` in GPU memory.
struct DeviceBuffer {
  DeviceBuffer(DType type, size_t n) : t(type), count(n) {
    cuda_ok(cudaMalloc(&p, std::max<size_t>(n * ddp::dtype_size(t), 1)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Buffer buf() const { return Buffer{p, count, t, ddp::Device::Cuda}; }

  void upload(const std::vector<double>& v) {
    std::vector<std::byte> bytes(v.size() * ddp::dtype_size(t));
    for (size_t i = 0; i < v.size(); ++i) put(bytes.data(), i, v[i]);
    cuda_ok(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  std::vector<double> download() const {
    std::vector<std::byte> bytes(count * ddp::dtype_size(t));
    cuda_ok(cudaMemcpy(bytes.data(), p, bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    std::vector<double> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = get(bytes.data(), i);
    return v;
  }

  void put(std::byte* base, size_t i, double v) const {
    switch (t) {
      case DType::F32: reinterpret_cast<float*>(base)[i] = static_cast<float>(v); break;
      case DType::F64: reinterpret_cast<double*>(base)[i] = v; break;
      case DType::F16: reinterpret_cast<ddp::Half*>(base)[i] = ddp::to_half(static_cast<float>(v)); break;
      case DType::BF16: reinterpret_cast<ddp::BFloat16*>(base)[i] = ddp::to_bfloat16(static_cast<float>(v)); break;
      case DType::I32: reinterpret_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
      case DType::I64: reinterpret_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
      case DType::U8: reinterpret_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
    }
  }
  double get(const std::byte* base, size_t i) const {
    switch (t) {
      case DType::F32: return reinterpret_cast<const float*>(base)[i];
      case DType::F64: return reinterpret_cast<const double*>(base)[i];
      case DType::F16: return ddp::to_float(reinterpret_cast<const ddp::Half*>(base)[i]);
      case DType::BF16: return ddp::to_float(reinterpret_cast<const ddp::BFloat16*>(base)[i]);
      case DType::I32: return reinterpret_cast<const int32_t*>(base)[i];
      case DType::I64: return static_cast<double>(reinterpret_cast<const int64_t*>(base)[i]);
      case DType::U8: return reinterpret_cast<const uint8_t*>(base)[i];
    }
    return 0;
  }

  DType t;
  size_t count;
  void* p = nullptr;
};

inline bool is_float(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }

// Small integers from a hash of (rank, index), so every sum, product, min and max is
// exact in every dtype and a misplaced block differs from the reference.
inline double value(int rank, size_t i, ReduceOp op = ReduceOp::Sum) {
  uint64_t x = (static_cast<uint64_t>(rank + 1) << 32) ^ (i * 0x9e3779b97f4a7c15ULL);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 32;
  return static_cast<double>(op == ReduceOp::Prod ? 1 + x % 2 : 1 + x % 4);
}

inline std::vector<double> values(int rank, size_t n, ReduceOp op = ReduceOp::Sum, size_t from = 0) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(rank, from + i, op);
  return v;
}

// op over ranks 0..n-1 of value(r, i); Avg divides in the dtype's arithmetic
// (integers truncate, as NCCL's integer average does).
inline double reduced(DType t, ReduceOp op, int n, size_t i) {
  double acc = value(0, i, op);
  for (int r = 1; r < n; ++r) {
    const double v = value(r, i, op);
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += v;
    if (op == ReduceOp::Prod) acc *= v;
    if (op == ReduceOp::Min) acc = std::min(acc, v);
    if (op == ReduceOp::Max) acc = std::max(acc, v);
  }
  if (op != ReduceOp::Avg) return acc;
  return is_float(t) ? acc / n : std::trunc(acc / n);
}

inline bool same(DType t, const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tolerance = is_float(t) ? 1e-2 * std::max(1.0, std::fabs(want[i])) : 0;
    if (std::fabs(got[i] - want[i]) > tolerance) return false;
  }
  return true;
}

inline std::string label(const char* what, DType t, size_t count, const char* op = nullptr) {
  return std::string(what) + " " + ddp::dtype_name(t) + " count " + std::to_string(count) + (op ? " " : "") +
         (op ? op : "");
}

}  // namespace device_test
