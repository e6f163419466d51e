// Tensors and parameters: the storage the training core computes on.
//
// A Tensor is a row-major float32 matrix of rows × cols (a vector is 1 × n) on a
// device: host memory (Device::Cpu) or the current CUDA device's memory
// (Device::Cuda, when CUDA is built; one GPU per process, as torchrun programs use).
// It either owns its memory or is a view of memory someone else owns (a slice of a
// flat all-reduce bucket, say). Copying a Tensor makes an owning deep copy on the
// same device; moving is cheap; to() copies it to another device. Nothing here
// allocates except construction, copy, to() and a resize() that needs more capacity
// than the tensor has ever had.
//
// The element accessors (span, row, operator(), operator[]) read host memory: on a
// CUDA tensor span() throws InvalidArgument and the others must not be used. The
// whole-tensor operations (zero, fill, scale, copy_from, add_scaled, and the layers,
// losses and optimizers built on them) work on either device; on the GPU they run
// asynchronously on the default stream, and whatever returns a value to the host
// waits for them.
//
// A Parameter is a trainable value with its gradient and a name. Its grad starts
// owning; DistributedDataParallel may rebind it to a view into a bucket buffer with
// bind_grad() so backward writes gradients straight into the all-reduce buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ddp/types.hpp"

namespace ddp {

// True when this build has CUDA and a device can be used; otherwise false with the
// reason in *why (when why is not null).
bool cuda_device_available(std::string* why = nullptr);
// Waits for every operation queued on the current CUDA device (a no-op without one
// in use). Throws ddp::Error for a fault an earlier kernel hit.
void cuda_synchronize();

class Tensor {
 public:
  // An empty 0 × 0 owning tensor.
  Tensor() = default;
  // An owning rows × cols tensor on `device`, zero-filled. Device::Cuda throws
  // ddp::Error when CUDA is not built or the allocation fails.
  Tensor(size_t rows, size_t cols, Device device = Device::Cpu);
  // A non-owning view of rows*cols floats at `data` on `device`; the memory must
  // outlive the view (and every copy-free use of it). Writes go to that memory.
  static Tensor view(float* data, size_t rows, size_t cols, Device device = Device::Cpu);

  // Deep copy on other's device: the result owns its memory, even when `other` is a view.
  Tensor(const Tensor& other);
  // Copies the values of `other` into this tensor. A view keeps pointing at its
  // memory (and device; a view whose shape differs from `other` throws
  // InvalidArgument); an owning tensor takes other's shape and device.
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor() = default;

  Device device() const { return device_; }
  bool is_cuda() const { return device_ == Device::Cuda; }
  // An owning copy on `device` (a copy even when it is already there).
  Tensor to(Device device) const;

  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }
  size_t size() const { return rows_ * cols_; }
  bool empty() const { return size() == 0; }
  bool is_view() const { return view_; }

  float* data() { return data_; }
  const float* data() const { return data_; }
  // Host tensors only (InvalidArgument on a CUDA tensor).
  std::span<float> span();
  std::span<const float> span() const;
  float* row(size_t r) { return data_ + r * cols_; }
  const float* row(size_t r) const { return data_ + r * cols_; }
  float& operator()(size_t r, size_t c) { return data_[r * cols_ + c]; }
  float operator()(size_t r, size_t c) const { return data_[r * cols_ + c]; }
  float& operator[](size_t i) { return data_[i]; }
  float operator[](size_t i) const { return data_[i]; }

  // Sets the shape to rows × cols. An owning tensor reuses its memory when it has
  // room (so a per-step resize to a batch size seen before never allocates); new
  // elements are unspecified, and a CUDA tensor that must grow loses its values. A view can only keep its element count: any other
  // count throws InvalidArgument.
  void resize(size_t rows, size_t cols);
  // As resize(), but an owning tensor on another device first moves to `device`
  // (dropping its values): how layers keep their outputs on their input's device.
  void resize_on(Device device, size_t rows, size_t cols);
  void zero();
  void fill(float value);
  void scale(float factor);
  // Copies src's values into this tensor, across devices if need be; the shapes
  // must hold the same number of elements (throws InvalidArgument otherwise).
  // Keeps this tensor's shape.
  void copy_from(const Tensor& src);
  // this += alpha * other (same element count and device, else InvalidArgument).
  void add_scaled(const Tensor& other, float alpha);

 private:
  struct DeviceFree {
    void operator()(float* p) const noexcept;
  };
  std::vector<float> storage_;                  // owned host memory (empty for a view)
  std::unique_ptr<float, DeviceFree> device_storage_;  // owned device memory
  size_t device_capacity_ = 0;                  // floats in device_storage_
  float* data_ = nullptr;  // the owned storage of this device, or the viewed memory
  size_t rows_ = 0;
  size_t cols_ = 0;
  bool view_ = false;
  Device device_ = Device::Cpu;
};

// dst = the rows `indices` of the host tensor src, in that order (dst is resized to
// indices.size() × src.cols() on its own device: a CUDA dst gets the rows in one
// copy). Throws InvalidArgument for an index out of range or a CUDA src.
void gather_rows(const Tensor& src, std::span<const size_t> indices, Tensor& dst);

// Where a parameter of a model-parallel layer sits in the unsplit model's parameter of
// the same name (tensor parallelism splits a weight into equal blocks of rows or of
// columns). Checkpoints assemble the full parameter from the blocks and cut any
// layout's block out of it.
struct ParameterSplit {
  size_t full_rows = 0;  // the unsplit parameter's shape (0 × 0: this parameter's own)
  size_t full_cols = 0;
  int dim = -1;    // -1: whole (replicated where the layout repeats it); 0: rows split; 1: columns split
  int parts = 1;   // blocks along dim, equal in size (full / parts)
  int index = 0;   // the block this parameter holds
  bool whole() const { return dim < 0; }
};

// A trainable value, its gradient (same shape) and a name unique in its model
// ("0.weight", "2.bias", ...).
struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;  // owning, zero-filled, until bind_grad() points it elsewhere
  ParameterSplit split;  // whole unless a tensor-parallel layer holds a block of it

  Parameter() = default;
  Parameter(std::string param_name, size_t rows, size_t cols, Device device = Device::Cpu);
  Parameter(const Parameter&) = delete;  // models hold Parameter* (stable addresses)
  Parameter& operator=(const Parameter&) = delete;

  size_t numel() const { return rows() * cols(); }
  Device device() const { return value.empty() ? released_device_ : value.device(); }
  // Moves value and grad to `device` (values kept). The grad must be owning: move
  // a model before DistributedDataParallel binds its grads (InvalidArgument otherwise).
  void to(Device device);
  // Makes grad a view of numel() floats at `memory`, on this parameter's device
  // (e.g. this parameter's slot in a flat bucket buffer), copying the current gradient values there first so pending
  // accumulated gradients survive. `memory` must outlive the binding; a later
  // bind_grad(nullptr) makes the grad owning again (values copied back).
  void bind_grad(float* memory);

  // Sharded training (FSDP) frees a parameter's full value between uses and binds it to
  // gathered memory when a layer needs it:
  //   release_value(): the value's memory is freed (value becomes 0 × 0); the shape and
  //     device are kept (rows(), cols()), and materialized() turns false.
  //   bind_value(memory, copy): value becomes a view of rows()*cols() floats at `memory`
  //     on this parameter's device (the current values copied there first when `copy` and
  //     the value is materialized); `memory` must outlive the binding.
  // Layers refuse a parameter that is not materialized (InvalidArgument), rather than
  // read freed memory.
  void release_value();
  void bind_value(float* memory, bool copy = true);
  bool materialized() const { return !value.empty() || released_rows_ * released_cols_ == 0; }
  size_t rows() const { return value.empty() ? released_rows_ : value.rows(); }
  size_t cols() const { return value.empty() ? released_cols_ : value.cols(); }

 private:
  size_t released_rows_ = 0;  // the shape while released
  size_t released_cols_ = 0;
  Device released_device_ = Device::Cpu;
};

}  // namespace ddp
