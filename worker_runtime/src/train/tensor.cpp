// ddp::Tensor, gather_rows and ddp::Parameter.
#include "ddp/tensor.hpp"

#include <algorithm>
#include <cstring>

#include "ddp/types.hpp"

namespace ddp {

Tensor::Tensor(size_t rows, size_t cols) : storage_(rows * cols, 0.0f), rows_(rows), cols_(cols) {
  data_ = storage_.data();
}

Tensor Tensor::view(float* data, size_t rows, size_t cols) {
  if (data == nullptr && rows * cols != 0) throw InvalidArgument("Tensor::view of a null pointer");
  Tensor t;
  t.data_ = data;
  t.rows_ = rows;
  t.cols_ = cols;
  t.view_ = true;
  return t;
}

Tensor::Tensor(const Tensor& other)
    : storage_(other.data_, other.data_ + other.size()), rows_(other.rows_), cols_(other.cols_) {
  data_ = storage_.data();
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this == &other) return *this;
  if (view_) {
    if (rows_ != other.rows_ || cols_ != other.cols_) {
      throw InvalidArgument("assigning a " + std::to_string(other.rows_) + "x" + std::to_string(other.cols_) +
                            " tensor to a " + std::to_string(rows_) + "x" + std::to_string(cols_) + " view");
    }
  } else {
    resize(other.rows_, other.cols_);
  }
  if (size() != 0) std::memcpy(data_, other.data_, size() * sizeof(float));
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : storage_(std::move(other.storage_)), data_(other.data_), rows_(other.rows_), cols_(other.cols_),
      view_(other.view_) {
  other.data_ = nullptr;
  other.rows_ = other.cols_ = 0;
  other.view_ = false;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  storage_ = std::move(other.storage_);
  data_ = other.data_;
  rows_ = other.rows_;
  cols_ = other.cols_;
  view_ = other.view_;
  other.storage_.clear();
  other.data_ = nullptr;
  other.rows_ = other.cols_ = 0;
  other.view_ = false;
  return *this;
}

void Tensor::resize(size_t rows, size_t cols) {
  if (view_) {
    if (rows * cols != size()) {
      throw InvalidArgument("cannot resize a view of " + std::to_string(size()) + " elements to " +
                            std::to_string(rows) + "x" + std::to_string(cols));
    }
  } else if (rows * cols > storage_.size()) {
    storage_.resize(rows * cols);
    data_ = storage_.data();
  } else {
    data_ = storage_.data();  // keeps the memory: shrinking never reallocates
  }
  rows_ = rows;
  cols_ = cols;
}

void Tensor::zero() {
  if (size() != 0) std::memset(data_, 0, size() * sizeof(float));
}

void Tensor::fill(float value) { std::fill(data_, data_ + size(), value); }

void Tensor::copy_from(const Tensor& src) {
  if (src.size() != size()) {
    throw InvalidArgument("copy_from: " + std::to_string(src.size()) + " elements into a tensor of " +
                          std::to_string(size()));
  }
  if (size() != 0 && src.data_ != data_) std::memmove(data_, src.data_, size() * sizeof(float));
}

void Tensor::add_scaled(const Tensor& other, float alpha) {
  if (other.size() != size()) {
    throw InvalidArgument("add_scaled: " + std::to_string(other.size()) + " elements into a tensor of " +
                          std::to_string(size()));
  }
  float* __restrict d = data_;
  const float* __restrict s = other.data_;
  const size_t n = size();
  for (size_t i = 0; i < n; ++i) d[i] += alpha * s[i];
}

void gather_rows(const Tensor& src, std::span<const size_t> indices, Tensor& dst) {
  const size_t cols = src.cols();
  dst.resize(indices.size(), cols);
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] >= src.rows()) {
      throw InvalidArgument("gather_rows: index " + std::to_string(indices[i]) + " out of range (" +
                            std::to_string(src.rows()) + " rows)");
    }
    std::memcpy(dst.row(i), src.row(indices[i]), cols * sizeof(float));
  }
}

Parameter::Parameter(std::string param_name, size_t rows, size_t cols)
    : name(std::move(param_name)), value(rows, cols), grad(rows, cols) {}

void Parameter::bind_grad(float* memory) {
  if (memory == nullptr) {
    if (!grad.is_view()) return;
    Tensor owned(value.rows(), value.cols());
    owned.copy_from(grad);
    grad = std::move(owned);
    return;
  }
  Tensor bound = Tensor::view(memory, value.rows(), value.cols());
  if (grad.size() == bound.size()) {
    bound.copy_from(grad);
  } else {
    bound.zero();
  }
  grad = std::move(bound);
}

}  // namespace ddp
