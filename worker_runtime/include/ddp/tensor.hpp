// Host tensors and parameters: the storage the training core computes on.
//
// A Tensor is a row-major float32 matrix of rows × cols (a vector is 1 × n). It
// either owns its memory or is a view of memory someone else owns (a slice of a
// flat all-reduce bucket, say). Copying a Tensor makes an owning deep copy; moving
// is cheap. Nothing here allocates except construction, copy and a resize() that
// needs more capacity than the tensor has ever had.
//
// A Parameter is a trainable value with its gradient and a name. Its grad starts
// owning; DistributedDataParallel may rebind it to a view into a bucket buffer with
// bind_grad() so backward writes gradients straight into the all-reduce buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ddp {

class Tensor {
 public:
  // An empty 0 × 0 owning tensor.
  Tensor() = default;
  // An owning rows × cols tensor, zero-filled.
  Tensor(size_t rows, size_t cols);
  // A non-owning view of rows*cols floats at `data`; the memory must outlive the
  // view (and every copy-free use of it). Writes go to that memory.
  static Tensor view(float* data, size_t rows, size_t cols);

  // Deep copy: the result owns its memory, even when `other` is a view.
  Tensor(const Tensor& other);
  // Copies the values of `other` into this tensor's storage (a view keeps pointing
  // at its memory); a view whose shape differs from `other` throws InvalidArgument.
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor() = default;

  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }
  size_t size() const { return rows_ * cols_; }
  bool empty() const { return size() == 0; }
  bool is_view() const { return view_; }

  float* data() { return data_; }
  const float* data() const { return data_; }
  std::span<float> span() { return {data_, size()}; }
  std::span<const float> span() const { return {data_, size()}; }
  float* row(size_t r) { return data_ + r * cols_; }
  const float* row(size_t r) const { return data_ + r * cols_; }
  float& operator()(size_t r, size_t c) { return data_[r * cols_ + c]; }
  float operator()(size_t r, size_t c) const { return data_[r * cols_ + c]; }
  float& operator[](size_t i) { return data_[i]; }
  float operator[](size_t i) const { return data_[i]; }

  // Sets the shape to rows × cols. An owning tensor reuses its memory when it has
  // room (so a per-step resize to a batch size seen before never allocates); new
  // elements are unspecified. A view can only keep its element count: any other
  // count throws InvalidArgument.
  void resize(size_t rows, size_t cols);
  void zero();
  void fill(float value);
  // Copies src's values into this tensor; the shapes must hold the same number of
  // elements (throws InvalidArgument otherwise). Keeps this tensor's shape.
  void copy_from(const Tensor& src);
  // this += alpha * other (same element count, else InvalidArgument).
  void add_scaled(const Tensor& other, float alpha);

 private:
  std::vector<float> storage_;  // owned memory (empty for a view)
  float* data_ = nullptr;       // storage_.data() when owning, the viewed memory otherwise
  size_t rows_ = 0;
  size_t cols_ = 0;
  bool view_ = false;
};

// dst = the rows `indices` of src, in that order (dst is resized to
// indices.size() × src.cols()). Throws InvalidArgument for an index out of range.
void gather_rows(const Tensor& src, std::span<const size_t> indices, Tensor& dst);

// A trainable value, its gradient (same shape) and a name unique in its model
// ("0.weight", "2.bias", ...).
struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;  // owning, zero-filled, until bind_grad() points it elsewhere

  Parameter() = default;
  Parameter(std::string param_name, size_t rows, size_t cols);
  Parameter(const Parameter&) = delete;  // models hold Parameter* (stable addresses)
  Parameter& operator=(const Parameter&) = delete;

  size_t numel() const { return value.size(); }
  // Makes grad a view of numel() floats at `memory` (e.g. this parameter's slot in a
  // flat bucket buffer), copying the current gradient values there first so pending
  // accumulated gradients survive. `memory` must outlive the binding; a later
  // bind_grad(nullptr) makes the grad owning again (values copied back).
  void bind_grad(float* memory);
};

}  // namespace ddp
