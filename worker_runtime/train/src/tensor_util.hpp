// What the training library's sources share about tensors: a tensor as a comm Buffer,
// the "RxC" text errors give for a shape, a layer's per-slot state (Module::slot), and
// copying a block between row-major host matrices.
#pragma once

#include <cstring>
#include <deque>
#include <string>

#include "ddp/tensor.hpp"
#include "ddp/types.hpp"

namespace ddp::tensor_util {

// A tensor's floats as a comm Buffer on its device; a const one for operations that
// only read it (sends, a collective's input).
inline Buffer buffer_of(Tensor& t) { return Buffer{t.data(), t.size(), DType::F32, t.device()}; }
inline Buffer buffer_of(const Tensor& t) {
  return Buffer{const_cast<float*>(t.data()), t.size(), DType::F32, t.device()};
}

// `count` floats at `data` in host memory, as a comm Buffer.
inline Buffer host_floats(const float* data, size_t count) {
  return Buffer{const_cast<float*>(data), count, DType::F32, Device::Cpu};
}

// "3x4".
inline std::string shape_text(size_t rows, size_t cols) { return std::to_string(rows) + "x" + std::to_string(cols); }
inline std::string shape_text(const Tensor& t) { return shape_text(t.rows(), t.cols()); }

// A layer's state for activation slot `slot` (one per micro-batch in flight), made on
// first use; a deque, so the states of other slots never move.
template <typename State>
State& slot_state(std::deque<State>& slots, size_t slot) {
  while (slots.size() <= slot) slots.emplace_back();
  return slots[slot];
}

// Copies rows × cols floats between host row-major matrices of the given row strides.
inline void copy_rows(const float* src, size_t src_stride, float* dst, size_t dst_stride, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_stride, src + r * src_stride, cols * sizeof(float));
}

// dst (its rows × cols) = the block of host tensor src starting at (row0, col0).
inline void copy_block(const Tensor& src, size_t row0, size_t col0, Tensor& dst) {
  copy_rows(src.data() + row0 * src.cols() + col0, src.cols(), dst.data(), dst.cols(), dst.rows(), dst.cols());
}

}  // namespace ddp::tensor_util
