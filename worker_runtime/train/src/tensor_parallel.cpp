// ColumnParallelLinear and RowParallelLinear: the block each rank keeps, the local
// GEMMs, and the one collective each layer runs per direction (see the header).
#include "ddp/tensor_parallel.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "ddp/gemm.hpp"
#include "ddp/types.hpp"
#include "device_ops.hpp"

namespace ddp {
namespace {

const Tensor kEmpty;  // what backward returns when no input gradient was asked for

std::string shape(size_t rows, size_t cols) { return std::to_string(rows) + "x" + std::to_string(cols); }
std::string shape(const Tensor& t) { return shape(t.rows(), t.cols()); }

Buffer buffer(Tensor& t) { return Buffer{t.data(), t.size(), DType::F32, t.device()}; }
Buffer buffer(const Tensor& t) { return Buffer{const_cast<float*>(t.data()), t.size(), DType::F32, t.device()}; }

// features / tp->size(), refusing a missing group or features that do not divide.
size_t split_size(const char* layer, const char* what, size_t features, const std::shared_ptr<ProcessGroup>& tp) {
  if (!tp) throw InvalidArgument(std::string(layer) + ": no tp group");
  const auto parts = static_cast<size_t>(tp->size());
  if (features % parts != 0) {
    throw InvalidArgument(std::string(layer) + ": " + what + " " + std::to_string(features) +
                          " does not divide by the tp group's " + std::to_string(parts) + " ranks");
  }
  return features / parts;
}

// dst (rows × cols) = the block of src starting at (row0, col0).
void copy_block(const Tensor& src, size_t row0, size_t col0, Tensor& dst) {
  for (size_t r = 0; r < dst.rows(); ++r) {
    std::memcpy(dst.row(r), src.row(row0 + r) + col0, dst.cols() * sizeof(float));
  }
}

ParameterSplit split_of(const Parameter& full, int dim, const ProcessGroup& tp) {
  ParameterSplit s;
  s.full_rows = full.rows();
  s.full_cols = full.cols();
  s.dim = dim;
  s.parts = dim < 0 ? 1 : tp.size();
  s.index = dim < 0 ? 0 : tp.rank();
  return s;
}

// What a layer checks before it computes: gathered parameters (sharded training may
// have released them) on the input's device.
void need_usable(const char* layer, const Parameter& weight, const Parameter& bias, Device input) {
  for (const Parameter* p : {&weight, &bias}) {
    if (!p->materialized()) {
      throw InvalidArgument(std::string(layer) + ": parameter '" + p->name + "' is not gathered (its value is sharded)");
    }
  }
  if (weight.device() != input) {
    throw InvalidArgument(std::string(layer) + ": the input is on " + device_name(input) + " but '" + weight.name +
                          "' is on " + device_name(weight.device()) + " (move the model with Module::to)");
  }
}

void need_shape(const char* what, const Tensor& t, size_t rows, size_t cols) {
  if (t.rows() != rows || t.cols() != cols) {
    throw InvalidArgument(std::string(what) + " is " + shape(t) + ", expected " + shape(rows, cols));
  }
}

void host_only(const char* what, Device device) {
  if (device == Device::Cuda) throw InvalidArgument(std::string(what) + " is host only for now (the tensors are on cuda)");
}

// y = x Wᵀ + beta·y (batch × out).
void times_weight_t(const Tensor& x, const Parameter& w, float beta, Tensor& y) {
  if (x.rows() == 0) return;
  sgemm_on(x.device(), Transpose::No, Transpose::Yes, x.rows(), w.rows(), w.cols(), 1.0f, x.data(), w.cols(),
           w.value.data(), w.cols(), beta, y.data(), y.cols());
}

// Every row of y = b (as Linear starts its output).
void set_rows(Tensor& y, const Parameter& b) {
  if (y.is_cuda()) {
    detail::device::set_rows(y.data(), b.value.data(), y.rows(), y.cols());
  } else {
    for (size_t r = 0; r < y.rows(); ++r) std::memcpy(y.row(r), b.value.data(), y.cols() * sizeof(float));
  }
}

// The parameter gradients of y = x Wᵀ + b: dW += dyᵀ x, db += column sums of dy (in
// row order, as Linear), then the hook for the bias and the weight.
void add_parameter_grads(const Tensor& dy, const Tensor& x, Parameter& w, Parameter& b, const GradReadyHook& hook) {
  const size_t batch = dy.rows(), out = dy.cols();
  if (batch != 0) {
    sgemm_on(dy.device(), Transpose::Yes, Transpose::No, out, w.cols(), batch, 1.0f, dy.data(), out, x.data(),
             w.cols(), 1.0f, w.grad.data(), w.cols());
    if (!b.value.empty() && dy.is_cuda()) {
      detail::device::add_column_sums(b.grad.data(), dy.data(), batch, out);
    } else if (!b.value.empty()) {
      float* __restrict db = b.grad.data();
      for (size_t r = 0; r < batch; ++r) {
        const float* __restrict g = dy.row(r);
        for (size_t j = 0; j < out; ++j) db[j] += g[j];
      }
    }
  }
  if (hook) {
    if (!b.value.empty()) hook(b);
    hook(w);
  }
}

// dx = dy W (batch × in).
void times_weight(const Tensor& dy, const Parameter& w, Tensor& dx) {
  dx.resize_on(dy.device(), dy.rows(), w.cols());
  if (dy.rows() == 0) return;
  sgemm_on(dy.device(), Transpose::No, Transpose::No, dy.rows(), w.cols(), w.rows(), 1.0f, dy.data(), w.rows(),
           w.value.data(), w.cols(), 0.0f, dx.data(), w.cols());
}

template <typename Slot>
Slot& slot_at(std::deque<Slot>& slots, size_t slot) {
  while (slots.size() <= slot) slots.emplace_back();
  return slots[slot];
}

}  // namespace

// ---------------------------------------------------------------------------
// TensorParallelLinear
// ---------------------------------------------------------------------------

TensorParallelLinear::TensorParallelLinear(const char* layer, const LinearOptions& full, Rng& rng,
                                           std::shared_ptr<ProcessGroup> tp, const std::string& name_prefix,
                                           int split_dim)
    : full_(full),
      tp_(std::move(tp)),
      local_(split_size(layer, split_dim == 0 ? "out_features" : "in_features",
                        split_dim == 0 ? full.out_features : full.in_features, tp_)),
      weight_(name_prefix + "weight", split_dim == 0 ? local_ : full.out_features,
              split_dim == 0 ? full.in_features : local_),
      bias_(name_prefix + "bias", full.bias ? 1 : 0, full.bias ? (split_dim == 0 ? local_ : full.out_features) : 0) {
  Linear whole(full, rng, name_prefix);  // the same draws as the unsplit layer
  const size_t first = static_cast<size_t>(tp_->rank()) * local_;
  copy_block(whole.weight().value, split_dim == 0 ? first : 0, split_dim == 0 ? 0 : first, weight_.value);
  weight_.split = split_of(whole.weight(), split_dim, *tp_);
  if (full.bias) {  // a column layer's bias is split with its outputs; a row layer's is whole
    copy_block(whole.bias().value, 0, split_dim == 0 ? first : 0, bias_.value);
    bias_.split = split_of(whole.bias(), split_dim == 0 ? 1 : -1, *tp_);
  }
}

std::vector<Parameter*> TensorParallelLinear::parameters() {
  if (full_.bias) return {&weight_, &bias_};
  return {&weight_};
}

// ---------------------------------------------------------------------------
// ColumnParallelLinear
// ---------------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(const LinearOptions& full, Rng& rng, std::shared_ptr<ProcessGroup> tp,
                                           const std::string& name_prefix, const ColumnParallelOptions& options)
    : TensorParallelLinear("ColumnParallelLinear", full, rng, std::move(tp), name_prefix, 0), options_(options) {}

const Tensor& ColumnParallelLinear::forward(const Tensor& x) {
  if (x.cols() != full_.in_features) {
    throw InvalidArgument("ColumnParallelLinear(" + std::to_string(full_.in_features) + " -> " +
                          std::to_string(full_.out_features) + "): input is " + shape(x));
  }
  need_usable("ColumnParallelLinear", weight_, bias_, x.device());
  if (options_.gather_output) host_only("ColumnParallelLinear's gather_output", x.device());
  Slot& s = slot_at(slots_, slot());
  const size_t batch = x.rows();
  s.input = &x;
  s.local.resize_on(x.device(), batch, local_);
  if (full_.bias) set_rows(s.local, bias_);
  times_weight_t(x, weight_, full_.bias ? 1.0f : 0.0f, s.local);
  if (!options_.gather_output) return s.local;
  // Every rank's columns, in rank order, then laid side by side: row b of the output
  // is row b of block 0, of block 1, ...
  const auto parts = static_cast<size_t>(tp_->size());
  s.blocks.resize(parts * batch, local_);
  tp_->all_gather(buffer(s.local), buffer(s.blocks));
  s.gathered.resize(batch, full_.out_features);
  for (size_t p = 0; p < parts; ++p) {
    for (size_t b = 0; b < batch; ++b) {
      std::memcpy(s.gathered.row(b) + p * local_, s.blocks.row(p * batch + b), local_ * sizeof(float));
    }
  }
  return s.gathered;
}

const Tensor& ColumnParallelLinear::backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) {
  Slot& s = slot_at(slots_, slot());
  if (s.input == nullptr) throw InvalidArgument("ColumnParallelLinear::backward before forward");
  const Tensor& x = *s.input;
  need_usable("ColumnParallelLinear::backward", weight_, bias_, x.device());
  if (dy.device() != x.device()) throw InvalidArgument("ColumnParallelLinear::backward: dy is on another device than x");
  const size_t batch = x.rows();
  const Tensor* g = &dy;
  if (options_.gather_output) {  // keep this rank's columns of the whole dy
    need_shape("ColumnParallelLinear::backward: dy", dy, batch, full_.out_features);
    host_only("ColumnParallelLinear's gather_output", dy.device());
    s.dy_local.resize(batch, local_);
    copy_block(dy, 0, static_cast<size_t>(tp_->rank()) * local_, s.dy_local);
    g = &s.dy_local;
  } else {
    need_shape("ColumnParallelLinear::backward: dy", dy, batch, local_);
  }
  add_parameter_grads(*g, x, weight_, bias_, hook);
  if (!need_dx) return kEmpty;
  // f's backward: each rank's dy W_local covers its output columns; their sum is dx.
  times_weight(*g, weight_, dx_);
  tp_->all_reduce(buffer(dx_), ReduceOp::Sum);
  return dx_;
}

// ---------------------------------------------------------------------------
// RowParallelLinear
// ---------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(const LinearOptions& full, Rng& rng, std::shared_ptr<ProcessGroup> tp,
                                     const std::string& name_prefix, const RowParallelOptions& options)
    : TensorParallelLinear("RowParallelLinear", full, rng, std::move(tp), name_prefix, 1), options_(options) {}

const Tensor& RowParallelLinear::forward(const Tensor& x) {
  if (x.cols() != local_) {
    throw InvalidArgument("RowParallelLinear(" + std::to_string(full_.in_features) + " -> " +
                          std::to_string(full_.out_features) + ", " + std::to_string(local_) +
                          " input features per tp rank): input is " + shape(x));
  }
  need_usable("RowParallelLinear", weight_, bias_, x.device());
  const size_t batch = x.rows(), out = full_.out_features;
  const auto parts = static_cast<size_t>(tp_->size());
  if (options_.scatter_output && batch % parts != 0) {
    throw InvalidArgument("RowParallelLinear with scatter_output: the batch of " + std::to_string(batch) +
                          " rows does not divide by the tp group's " + std::to_string(parts) + " ranks");
  }
  Slot& s = slot_at(slots_, slot());
  s.input = &x;
  s.partial.resize_on(x.device(), batch, out);
  times_weight_t(x, weight_, 0.0f, s.partial);
  // g's forward: the partial products summed over tp (or each rank's row block of the sum).
  Tensor* y = &s.partial;
  if (options_.scatter_output) {
    s.output.resize_on(x.device(), batch / parts, out);
    tp_->reduce_scatter(buffer(s.partial), buffer(s.output), ReduceOp::Sum);
    y = &s.output;
  } else {
    tp_->all_reduce(buffer(s.partial), ReduceOp::Sum);
  }
  if (full_.bias && y->rows() != 0) {  // y += ones · b: the bias once, after the reduction
    if (ones_.rows() < y->rows() || ones_.device() != y->device()) {
      ones_.resize_on(y->device(), y->rows(), 1);
      ones_.fill(1.0f);
    }
    sgemm_on(y->device(), Transpose::No, Transpose::No, y->rows(), out, 1, 1.0f, ones_.data(), 1, bias_.value.data(),
             out, 1.0f, y->data(), out);
  }
  return *y;
}

const Tensor& RowParallelLinear::backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) {
  Slot& s = slot_at(slots_, slot());
  if (s.input == nullptr) throw InvalidArgument("RowParallelLinear::backward before forward");
  const Tensor& x = *s.input;
  need_usable("RowParallelLinear::backward", weight_, bias_, x.device());
  if (dy.device() != x.device()) throw InvalidArgument("RowParallelLinear::backward: dy is on another device than x");
  const size_t batch = x.rows(), out = full_.out_features;
  const Tensor* g = &dy;
  if (options_.scatter_output) {  // every rank's row block of dy, in rank order: the whole dy
    need_shape("RowParallelLinear::backward: dy", dy, batch / static_cast<size_t>(tp_->size()), out);
    s.dy_full.resize_on(dy.device(), batch, out);
    tp_->all_gather(buffer(dy), buffer(s.dy_full));
    g = &s.dy_full;
  } else {
    need_shape("RowParallelLinear::backward: dy", dy, batch, out);
  }
  // g's backward is the identity: dy is whole on every rank, and dW, db and dx are local.
  add_parameter_grads(*g, x, weight_, bias_, hook);
  if (!need_dx) return kEmpty;
  times_weight(*g, weight_, dx_);
  return dx_;
}

}  // namespace ddp
