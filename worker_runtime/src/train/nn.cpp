// Linear, ReLU, Sequential, make_mlp and the softmax cross-entropy loss.
#include "ddp/nn.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ddp/gemm.hpp"
#include "ddp/types.hpp"

namespace ddp {
namespace {

const Tensor kEmpty;  // what backward returns when no input gradient was asked for

std::string shape(const Tensor& t) { return std::to_string(t.rows()) + "x" + std::to_string(t.cols()); }

}  // namespace

// ---------------------------------------------------------------------------
// Module
// ---------------------------------------------------------------------------

void Module::zero_grad() {
  for (Parameter* p : parameters()) p->grad.zero();
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
  const size_t batch = x.rows();
  input_ = &x;
  output_.resize(batch, out);
  float beta = 0.0f;
  if (options_.bias) {  // y = b broadcast, then y += x Wᵀ
    const float* b = bias_.value.data();
    for (size_t r = 0; r < batch; ++r) std::memcpy(output_.row(r), b, out * sizeof(float));
    beta = 1.0f;
  }
  if (batch != 0) {
    sgemm(Transpose::No, Transpose::Yes, batch, out, in, 1.0f, x.data(), in, weight_.value.data(), in, beta,
          output_.data(), out);
  }
  return output_;
}

const Tensor& Linear::backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) {
  const size_t in = options_.in_features, out = options_.out_features;
  if (input_ == nullptr) throw InvalidArgument("Linear::backward before forward");
  const size_t batch = input_->rows();
  if (dy.rows() != batch || dy.cols() != out) {
    throw InvalidArgument("Linear::backward: dy is " + shape(dy) + ", expected " + std::to_string(batch) + "x" +
                          std::to_string(out));
  }
  if (batch != 0) {
    // dW += dyᵀ x   (out × batch · batch × in)
    sgemm(Transpose::Yes, Transpose::No, out, in, batch, 1.0f, dy.data(), out, input_->data(), in, 1.0f,
          weight_.grad.data(), in);
    // db += column sums of dy
    if (options_.bias) {
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
  dx_.resize(batch, in);
  if (batch != 0) {
    sgemm(Transpose::No, Transpose::No, batch, in, out, 1.0f, dy.data(), out, weight_.value.data(), in, 0.0f,
          dx_.data(), in);
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
  output_.resize(x.rows(), x.cols());
  const float* __restrict in = x.data();
  float* __restrict y = output_.data();
  const size_t n = x.size();
  for (size_t i = 0; i < n; ++i) y[i] = in[i] > 0.0f ? in[i] : 0.0f;
  return output_;
}

const Tensor& ReLU::backward(const Tensor& dy, const GradReadyHook&, bool need_dx) {
  if (dy.rows() != output_.rows() || dy.cols() != output_.cols()) {
    throw InvalidArgument("ReLU::backward: dy is " + shape(dy) + ", output was " + shape(output_));
  }
  if (!need_dx) return kEmpty;
  dx_.resize(dy.rows(), dy.cols());
  const float* __restrict y = output_.data();
  const float* __restrict g = dy.data();
  float* __restrict dx = dx_.data();
  const size_t n = dy.size();
  for (size_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? g[i] : 0.0f;
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

float softmax_cross_entropy(const Tensor& logits, std::span<const int32_t> labels, Tensor& dlogits) {
  const size_t batch = logits.rows(), classes = logits.cols();
  if (labels.size() != batch) {
    throw InvalidArgument("softmax_cross_entropy: " + std::to_string(labels.size()) + " labels for " +
                          std::to_string(batch) + " rows");
  }
  if (batch == 0 || classes == 0) throw InvalidArgument("softmax_cross_entropy: empty logits " + shape(logits));
  dlogits.resize(batch, classes);
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double total = 0.0;
  for (size_t r = 0; r < batch; ++r) {
    const int32_t label = labels[r];
    if (label < 0 || static_cast<size_t>(label) >= classes) {
      throw InvalidArgument("softmax_cross_entropy: label " + std::to_string(label) + " outside [0, " +
                            std::to_string(classes) + ")");
    }
    const float* x = logits.row(r);
    float* d = dlogits.row(r);
    const float max = *std::max_element(x, x + classes);
    float sum = 0.0f;
    for (size_t j = 0; j < classes; ++j) {
      d[j] = std::exp(x[j] - max);
      sum += d[j];
    }
    total += static_cast<double>(max) + std::log(static_cast<double>(sum)) - static_cast<double>(x[label]);
    const float scale = inv_batch / sum;
    for (size_t j = 0; j < classes; ++j) d[j] *= scale;
    d[label] -= inv_batch;
  }
  return static_cast<float>(total / static_cast<double>(batch));
}

size_t count_correct(const Tensor& logits, std::span<const int32_t> labels) {
  const size_t batch = logits.rows();
  if (labels.size() != batch) {
    throw InvalidArgument("count_correct: " + std::to_string(labels.size()) + " labels for " +
                          std::to_string(batch) + " rows");
  }
  size_t correct = 0;
  for (size_t r = 0; r < batch; ++r) {
    const float* x = logits.row(r);
    const auto best = std::max_element(x, x + logits.cols()) - x;
    if (best == labels[r]) ++correct;
  }
  return correct;
}

}  // namespace ddp
