// ddp::Tensor, gather_rows and ddp::Parameter, on the host and (device_ops.hpp) the GPU.
#include "ddp/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ddp/types.hpp"
#include "device_ops.hpp"

namespace ddp {

namespace dev = detail::device;

bool cuda_device_available(std::string* why) { return dev::available(why); }

void cuda_synchronize() {
  if (dev::available(nullptr)) dev::synchronize();
}

void Tensor::DeviceFree::operator()(float* p) const noexcept { dev::release(p); }

Tensor::Tensor(size_t rows, size_t cols, Device device) : rows_(rows), cols_(cols), device_(device) {
  if (device == Device::Cuda) {
    device_storage_.reset(dev::alloc(size()));
    device_capacity_ = size();
    data_ = device_storage_.get();
    dev::fill(data_, size(), 0.0f);
  } else {
    storage_.assign(size(), 0.0f);
    data_ = storage_.data();
  }
}

Tensor Tensor::view(float* data, size_t rows, size_t cols, Device device) {
  if (data == nullptr && rows * cols != 0) throw InvalidArgument("Tensor::view of a null pointer");
  Tensor t;
  t.data_ = data;
  t.rows_ = rows;
  t.cols_ = cols;
  t.view_ = true;
  t.device_ = device;
  return t;
}

Tensor::Tensor(const Tensor& other) : Tensor() {
  resize_on(other.device_, other.rows_, other.cols_);
  copy_from(other);
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this == &other) return *this;
  if (view_) {
    if (rows_ != other.rows_ || cols_ != other.cols_) {
      throw InvalidArgument("assigning a " + std::to_string(other.rows_) + "x" + std::to_string(other.cols_) +
                            " tensor to a " + std::to_string(rows_) + "x" + std::to_string(cols_) + " view");
    }
  } else {
    resize_on(other.device_, other.rows_, other.cols_);
  }
  copy_from(other);
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : storage_(std::move(other.storage_)),
      device_storage_(std::move(other.device_storage_)),
      device_capacity_(other.device_capacity_),
      data_(other.data_),
      rows_(other.rows_),
      cols_(other.cols_),
      view_(other.view_),
      device_(other.device_) {
  other.device_capacity_ = 0;
  other.data_ = nullptr;
  other.rows_ = other.cols_ = 0;
  other.view_ = false;
  other.device_ = Device::Cpu;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  storage_ = std::move(other.storage_);
  device_storage_ = std::move(other.device_storage_);
  device_capacity_ = other.device_capacity_;
  data_ = other.data_;
  rows_ = other.rows_;
  cols_ = other.cols_;
  view_ = other.view_;
  device_ = other.device_;
  other.storage_.clear();
  other.device_capacity_ = 0;
  other.data_ = nullptr;
  other.rows_ = other.cols_ = 0;
  other.view_ = false;
  other.device_ = Device::Cpu;
  return *this;
}

Tensor Tensor::to(Device device) const {
  Tensor t(0, 0, Device::Cpu);
  t.resize_on(device, rows_, cols_);
  t.copy_from(*this);
  return t;
}

std::span<float> Tensor::span() {
  if (is_cuda()) throw InvalidArgument("Tensor::span() of a CUDA tensor (copy it to the host with to(Device::Cpu))");
  return {data_, size()};
}

std::span<const float> Tensor::span() const {
  if (is_cuda()) throw InvalidArgument("Tensor::span() of a CUDA tensor (copy it to the host with to(Device::Cpu))");
  return {data_, size()};
}

void Tensor::resize(size_t rows, size_t cols) {
  const size_t n = rows * cols;
  if (view_) {
    if (n != size()) {
      throw InvalidArgument("cannot resize a view of " + std::to_string(size()) + " elements to " +
                            std::to_string(rows) + "x" + std::to_string(cols));
    }
  } else if (device_ == Device::Cuda) {
    if (n > device_capacity_ || !device_storage_) {
      // Free before allocating (the GPU may be nearly full), and be an empty tensor
      // if the allocation throws, not one pointing at freed memory.
      device_storage_.reset();
      device_capacity_ = 0;
      data_ = nullptr;
      rows_ = cols_ = 0;
      device_storage_.reset(dev::alloc(n));
      device_capacity_ = n;
    }
    data_ = device_storage_.get();
  } else {
    if (n > storage_.size()) storage_.resize(n);
    data_ = storage_.data();  // keeps the memory: shrinking never reallocates
  }
  rows_ = rows;
  cols_ = cols;
}

void Tensor::resize_on(Device device, size_t rows, size_t cols) {
  if (!view_ && device != device_) {
    storage_ = {};
    device_storage_.reset();
    device_capacity_ = 0;
    data_ = nullptr;
    rows_ = cols_ = 0;
    device_ = device;
  }
  resize(rows, cols);
}

void Tensor::zero() { fill(0.0f); }

void Tensor::fill(float value) {
  if (is_cuda()) {
    dev::fill(data_, size(), value);
  } else if (value == 0.0f && !std::signbit(value)) {  // +0.0 is all zero bytes
    if (size() != 0) std::memset(data_, 0, size() * sizeof(float));
  } else {
    std::fill(data_, data_ + size(), value);
  }
}

void Tensor::scale(float factor) {
  if (is_cuda()) {
    dev::scale(data_, size(), factor);
    return;
  }
  for (float& v : span()) v *= factor;
}

void Tensor::copy_from(const Tensor& src) {
  if (src.size() != size()) {
    throw InvalidArgument("copy_from: " + std::to_string(src.size()) + " elements into a tensor of " +
                          std::to_string(size()));
  }
  if (size() == 0 || src.data_ == data_) return;
  if (is_cuda() || src.is_cuda()) {
    dev::copy(data_, src.data_, size());
  } else {
    std::memmove(data_, src.data_, size() * sizeof(float));
  }
}

void Tensor::add_scaled(const Tensor& other, float alpha) {
  if (other.size() != size() || other.device_ != device_) {
    throw InvalidArgument("add_scaled: " + std::to_string(other.size()) + " elements (" +
                          device_name(other.device_) + ") into a tensor of " + std::to_string(size()) + " (" +
                          device_name(device_) + ")");
  }
  if (is_cuda()) {
    dev::axpy(data_, other.data_, size(), alpha);
    return;
  }
  float* __restrict d = data_;
  const float* __restrict s = other.data_;
  const size_t n = size();
  for (size_t i = 0; i < n; ++i) d[i] += alpha * s[i];
}

void gather_rows(const Tensor& src, std::span<const size_t> indices, Tensor& dst) {
  if (src.is_cuda()) throw InvalidArgument("gather_rows: the source must be a host tensor");
  const size_t cols = src.cols();
  for (size_t i : indices) {
    if (i >= src.rows()) {
      throw InvalidArgument("gather_rows: index " + std::to_string(i) + " out of range (" +
                            std::to_string(src.rows()) + " rows)");
    }
  }
  // A CUDA destination gets the rows gathered on the host first, then one copy.
  thread_local Tensor staging;
  Tensor& host = dst.is_cuda() ? staging : dst;
  host.resize(indices.size(), cols);
  for (size_t i = 0; i < indices.size(); ++i) std::memcpy(host.row(i), src.row(indices[i]), cols * sizeof(float));
  if (dst.is_cuda()) {
    dst.resize(indices.size(), cols);
    dst.copy_from(host);
  }
}

Parameter::Parameter(std::string param_name, size_t rows, size_t cols, Device device)
    : name(std::move(param_name)), value(rows, cols, device), grad(rows, cols, device) {}

void Parameter::to(Device device) {
  if (device == value.device()) return;
  if (grad.is_view()) {
    throw InvalidArgument("Parameter::to: '" + name +
                          "' has its grad bound to a bucket; move the model before wrapping it in DistributedDataParallel");
  }
  // Both copies first: a failure leaves the parameter whole on its old device.
  Tensor moved_value = value.to(device);
  Tensor moved_grad = grad.to(device);
  value = std::move(moved_value);
  grad = std::move(moved_grad);
}

void Parameter::bind_grad(float* memory) {
  if (memory == nullptr) {
    if (!grad.is_view()) return;
    Tensor owned(value.rows(), value.cols(), value.device());
    owned.copy_from(grad);
    grad = std::move(owned);
    return;
  }
  Tensor bound = Tensor::view(memory, value.rows(), value.cols(), value.device());
  if (grad.size() == bound.size()) {
    bound.copy_from(grad);
  } else {
    bound.zero();
  }
  grad = std::move(bound);
}

void Parameter::release_value() {
  if (!value.empty()) {
    released_rows_ = value.rows();
    released_cols_ = value.cols();
    released_device_ = value.device();
  }
  value = Tensor();  // an owning 0 × 0 tensor: the old storage is freed
}

void Parameter::bind_value(float* memory, bool copy) {
  const Device device = value.empty() ? released_device_ : value.device();
  Tensor bound = Tensor::view(memory, rows(), cols(), device);
  if (copy && !value.empty()) bound.copy_from(value);
  value = std::move(bound);
  released_rows_ = released_cols_ = 0;
}

}  // namespace ddp
