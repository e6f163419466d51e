// Linear, ReLU, Sequential, make_mlp and the softmax cross-entropy loss.
#include "ddp/nn.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ddp/gemm.hpp"
#include "ddp/types.hpp"
#include "device_ops.hpp"
#include "rules.hpp"

namespace ddp {
namespace {

// A parameter released by sharded training (FSDP) must be gathered before use.
void need_gathered(const Parameter& weight, const Parameter& bias) {
  for (const Parameter* p : {&weight, &bias}) {
    if (!p->materialized()) {
      throw InvalidArgument("Linear: parameter '" + p->name + "' is not gathered (its value is sharded)");
    }
  }
}

const Tensor kEmpty;  // what backward returns when no input gradient was asked for

// The state of `slot`, made on first use.
template <typename T>
T& slot_state(std::deque<T>& slots, size_t slot) {
  if (slot >= slots.size()) slots.resize(slot + 1);
  return slots[slot];
}

std::string shape(const Tensor& t) { return std::to_string(t.rows()) + "x" + std::to_string(t.cols()); }

// A layer computes where its input lives: `what` (its parameters, or the gradient
// coming back) must be there too.
void need_device(const char* layer, Device input, Device have, const std::string& what) {
  if (have != input) {
    throw InvalidArgument(std::string(layer) + ": the input is on " + device_name(input) + " but " + what + " is on " +
                          device_name(have) + " (move the model with Module::to)");
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Module
// ---------------------------------------------------------------------------

void Module::zero_grad() {
  for (Parameter* p : parameters()) p->grad.zero();
}

void Module::to(Device device) {
  for (Parameter* p : parameters()) p->to(device);
}

size_t Module::num_parameters() {
  size_t n = 0;
  for (Parameter* p : parameters()) n += p->numel();
  return n;
}

// ---------------------------------------------------------------------------
// Linear
// ---------------------------------------------------------------------------

Linear::Linear(const LinearOptions& options, Rng& rng, const std::string& name_prefix)
    : options_(options),
      weight_(name_prefix + "weight", options.out_features, options.in_features),
      bias_(name_prefix + "bias", options.bias ? 1 : 0, options.bias ? options.out_features : 0) {
  if (options.in_features == 0 || options.out_features == 0) {
    throw InvalidArgument(std::string("Linear: zero features (") + std::to_string(options.in_features) + " -> " +
                          std::to_string(options.out_features) + ")");
  }
  // kaiming_uniform_(a=sqrt(5)) gives bound = 1/sqrt(fan_in); torch's bias init
  // uses the same bound.
  const float bound = 1.0f / std::sqrt(static_cast<float>(options.in_features));
  for (float& w : weight_.value.span()) w = rng.uniform(-bound, bound);
  for (float& b : bias_.value.span()) b = rng.uniform(-bound, bound);
}

const Tensor& Linear::forward(const Tensor& x) {
  const size_t in = options_.in_features, out = options_.out_features;
  if (x.cols() != in) {
    throw InvalidArgument("Linear(" + std::to_string(in) + " -> " + std::to_string(out) + "): input is " + shape(x));
  }
  need_gathered(weight_, bias_);
  need_device("Linear", x.device(), weight_.device(), "'" + weight_.name + "'");
  const Device device = x.device();
  const size_t batch = x.rows();
  Activations& a = slot_state(slots_, slot());
  a.input = &x;
  Tensor& output = a.output;
  output.resize_on(device, batch, out);
  float beta = 0.0f;
  if (options_.bias) {  // y = b broadcast, then y += x Wᵀ
    const float* b = bias_.value.data();
    if (device == Device::Cuda) {
      detail::device::set_rows(output.data(), b, batch, out);
    } else {
      for (size_t r = 0; r < batch; ++r) std::memcpy(output.row(r), b, out * sizeof(float));
    }
    beta = 1.0f;
  }
  if (batch != 0) {
    sgemm_on(device, Transpose::No, Transpose::Yes, batch, out, in, 1.0f, x.data(), in, weight_.value.data(), in,
             beta, output.data(), out);
  }
  return output;
}

const Tensor& Linear::backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) {
  const size_t in = options_.in_features, out = options_.out_features;
  const Tensor* input = slot() < slots_.size() ? slots_[slot()].input : nullptr;
  if (input == nullptr) throw InvalidArgument("Linear::backward before forward (slot " + std::to_string(slot()) + ")");
  need_gathered(weight_, bias_);
  const size_t batch = input->rows();
  if (dy.rows() != batch || dy.cols() != out) {
    throw InvalidArgument("Linear::backward: dy is " + shape(dy) + ", expected " + std::to_string(batch) + "x" +
                          std::to_string(out));
  }
  const Device device = input->device();
  need_device("Linear::backward", device, dy.device(), "dy");
  if (batch != 0) {
    // dW += dyᵀ x   (out × batch · batch × in)
    sgemm_on(device, Transpose::Yes, Transpose::No, out, in, batch, 1.0f, dy.data(), out, input->data(), in, 1.0f,
             weight_.grad.data(), in);
    // db += column sums of dy
    if (options_.bias && device == Device::Cuda) {
      detail::device::add_column_sums(bias_.grad.data(), dy.data(), batch, out);
    } else if (options_.bias) {
      float* __restrict db = bias_.grad.data();
      for (size_t r = 0; r < batch; ++r) {
        const float* __restrict g = dy.row(r);
        for (size_t j = 0; j < out; ++j) db[j] += g[j];
      }
    }
  }
  // The parameter gradients are final: let the caller start reducing them while
  // the input gradient (and the earlier layers) are computed.
  if (hook) {
    if (options_.bias) hook(bias_);
    hook(weight_);
  }
  if (!need_dx) return kEmpty;
  // dx = dy W   (batch × out · out × in)
  dx_.resize_on(device, batch, in);
  if (batch != 0) {
    sgemm_on(device, Transpose::No, Transpose::No, batch, in, out, 1.0f, dy.data(), out, weight_.value.data(), in,
             0.0f, dx_.data(), in);
  }
  return dx_;
}

std::vector<Parameter*> Linear::parameters() {
  if (options_.bias) return {&weight_, &bias_};
  return {&weight_};
}

// ---------------------------------------------------------------------------
// ReLU
// ---------------------------------------------------------------------------

const Tensor& ReLU::forward(const Tensor& x) {
  Tensor& output = slot_state(outputs_, slot());
  output.resize_on(x.device(), x.rows(), x.cols());
  const float* __restrict in = x.data();
  float* __restrict y = output.data();
  const size_t n = x.size();
  if (x.is_cuda()) {
    detail::device::relu_forward(in, y, n);
  } else {
    for (size_t i = 0; i < n; ++i) y[i] = detail::rules::relu(in[i]);
  }
  return output;
}

const Tensor& ReLU::backward(const Tensor& dy, const GradReadyHook&, bool need_dx) {
  if (slot() >= outputs_.size()) throw InvalidArgument("ReLU::backward before forward (slot " + std::to_string(slot()) + ")");
  const Tensor& output = outputs_[slot()];
  if (dy.rows() != output.rows() || dy.cols() != output.cols()) {
    throw InvalidArgument("ReLU::backward: dy is " + shape(dy) + ", output was " + shape(output));
  }
  need_device("ReLU::backward", output.device(), dy.device(), "dy");
  if (!need_dx) return kEmpty;
  dx_.resize_on(dy.device(), dy.rows(), dy.cols());
  const float* __restrict y = output.data();
  const float* __restrict g = dy.data();
  float* __restrict dx = dx_.data();
  const size_t n = dy.size();
  if (dy.is_cuda()) {
    detail::device::relu_backward(y, g, dx, n);
  } else {
    for (size_t i = 0; i < n; ++i) dx[i] = detail::rules::relu_grad(y[i], g[i]);
  }
  return dx_;
}

// ---------------------------------------------------------------------------
// Sequential and make_mlp
// ---------------------------------------------------------------------------

Module& Sequential::append(std::unique_ptr<Module> m) {
  if (!m) throw InvalidArgument("Sequential::append of a null module");
  modules_.push_back(std::move(m));
  return *modules_.back();
}

const Tensor& Sequential::forward(const Tensor& x) {
  const Tensor* h = &x;
  for (auto& m : modules_) h = &m->forward(*h);
  return *h;
}

const Tensor& Sequential::backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) {
  const Tensor* g = &dy;
  for (size_t i = modules_.size(); i-- > 0;) g = &modules_[i]->backward(*g, hook, i > 0 || need_dx);
  return need_dx ? *g : kEmpty;
}

void Sequential::select_slot(size_t slot) {
  Module::select_slot(slot);
  for (auto& m : modules_) m->select_slot(slot);
}

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> all;
  for (auto& m : modules_) {
    for (Parameter* p : m->parameters()) all.push_back(p);
  }
  return all;
}

std::unique_ptr<Sequential> make_mlp(const MlpOptions& options) {
  const auto& sizes = options.sizes;
  if (sizes.size() < 2) throw InvalidArgument("make_mlp: needs at least an input and an output size");
  for (size_t s : sizes) {
    if (s == 0) throw InvalidArgument("make_mlp: a layer width is 0");
  }
  Rng rng(options.seed);
  auto model = std::make_unique<Sequential>();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    const std::string prefix = std::to_string(model->size()) + ".";
    model->add<Linear>(LinearOptions{sizes[i], sizes[i + 1], true}, rng, prefix);
    if (i + 2 < sizes.size()) model->add<ReLU>();
  }
  return model;
}

// ---------------------------------------------------------------------------
// Loss
// ---------------------------------------------------------------------------

namespace {

// One label per row; for the loss (which indexes by label) each must name a class.
void check_labels(const char* who, const Tensor& logits, std::span<const int32_t> labels, bool need_range) {
  if (labels.size() != logits.rows()) {
    throw InvalidArgument(std::string(who) + ": " + std::to_string(labels.size()) + " labels for " +
                          std::to_string(logits.rows()) + " rows");
  }
  for (const int32_t label : labels) {
    if (need_range && (label < 0 || static_cast<size_t>(label) >= logits.cols())) {
      throw InvalidArgument(std::string(who) + ": label " + std::to_string(label) + " outside [0, " +
                            std::to_string(logits.cols()) + ")");
    }
  }
}

}  // namespace

float softmax_cross_entropy(const Tensor& logits, std::span<const int32_t> labels, Tensor& dlogits) {
  const size_t batch = logits.rows(), classes = logits.cols();
  if (batch == 0 || classes == 0) throw InvalidArgument("softmax_cross_entropy: empty logits " + shape(logits));
  check_labels("softmax_cross_entropy", logits, labels, true);
  dlogits.resize_on(logits.device(), batch, classes);
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double total = 0.0;
  if (logits.is_cuda()) {
    total = detail::device::softmax_xent(logits.data(), labels.data(), batch, classes, inv_batch, dlogits.data());
  } else {
    for (size_t r = 0; r < batch; ++r) {
      total += detail::rules::softmax_xent_row(logits.row(r), classes, labels[r], inv_batch, dlogits.row(r));
    }
  }
  return static_cast<float>(total / static_cast<double>(batch));
}

size_t count_correct(const Tensor& logits, std::span<const int32_t> labels) {
  check_labels("count_correct", logits, labels, false);
  const size_t batch = logits.rows(), classes = logits.cols();
  if (batch == 0 || classes == 0) return 0;
  if (logits.is_cuda()) return detail::device::count_correct(logits.data(), labels.data(), batch, classes);
  size_t correct = 0;
  for (size_t r = 0; r < batch; ++r) {
    if (detail::rules::argmax_row(logits.row(r), classes) == static_cast<size_t>(labels[r])) ++correct;
  }
  return correct;
}

}  // namespace ddp
