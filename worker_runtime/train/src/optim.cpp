// SGD and AdamW with PyTorch's update rules, and their state on byte streams.
//
// State format (after the common header of kind, step count and tensor count):
//   SGD:   per parameter a u8 "has momentum buffer" and, if set, the buffer
//   AdamW: per parameter m then v
// Tensors are u64 rows, u64 cols, float32 values (binary_io::put_tensor).
#include "ddp/optim.hpp"

#include <cmath>
#include <istream>
#include <ostream>
#include <string>

#include "binary_io.hpp"
#include "ddp/types.hpp"
#include "device_ops.hpp"
#include "rules.hpp"

namespace ddp {
namespace {

using binary_io::get;
using binary_io::put;

void check_params(const std::vector<Parameter*>& params, const char* who) {
  for (const Parameter* p : params) {
    if (p == nullptr) throw InvalidArgument(std::string(who) + ": null parameter");
    if (p->grad.size() != p->value.size()) {
      throw InvalidArgument(std::string(who) + ": parameter " + p->name + " has a grad of another size");
    }
  }
}

void put_header(std::ostream& out, const char* kind, int64_t steps, size_t count) {
  binary_io::put_string(out, kind);
  put<int64_t>(out, steps);
  put<uint64_t>(out, count);
}

// Reads and checks the header; returns the step count.
int64_t get_header(std::istream& in, const char* kind, size_t count) {
  const std::string stored = binary_io::get_string(in, "optimizer kind", 64);
  if (stored != kind) {
    throw Error(std::string("optimizer state is for '") + stored + "', this optimizer is '" + kind + "'");
  }
  const auto steps = get<int64_t>(in, "optimizer step count");
  if (steps < 0) throw Error(std::string("optimizer state has a negative step count"));
  const auto n = get<uint64_t>(in, "optimizer parameter count");
  if (n != count) {
    throw Error(std::string("optimizer state has ") + std::to_string(n) + " parameters, this optimizer has " +
                std::to_string(count));
  }
  return steps;
}

// State buffers follow their parameter: a state loaded from a checkpoint (host) or
// made before Module::to moves to the parameter's device at the next step.
void follow(Tensor& state, const Parameter& p) {
  if (state.device() != p.device()) state = state.to(p.device());
}

}  // namespace

// ---------------------------------------------------------------------------
// Optimizer
// ---------------------------------------------------------------------------

Optimizer::Optimizer(std::vector<Parameter*> params, float lr) : params_(std::move(params)), lr_(lr) {
  check_params(params_, "Optimizer");
  if (!(lr >= 0.0f)) throw InvalidArgument("Optimizer: learning rate " + std::to_string(lr));
}

void Optimizer::zero_grad() {
  for (Parameter* p : params_) p->grad.zero();
}

// ---------------------------------------------------------------------------
// SGD
// ---------------------------------------------------------------------------

SGD::SGD(std::vector<Parameter*> params, const SgdOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options), momentum_(params_.size()) {
  if (!(options.momentum >= 0.0f)) throw InvalidArgument("SGD: momentum " + std::to_string(options.momentum));
  if (!(options.weight_decay >= 0.0f)) {
    throw InvalidArgument("SGD: weight_decay " + std::to_string(options.weight_decay));
  }
}

void SGD::step() {
  const detail::rules::Sgd rule{lr_, options_.momentum, options_.weight_decay};
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    float* __restrict w = p.value.data();
    const float* __restrict g = p.grad.data();
    const size_t n = p.numel();
    const bool cuda = p.value.is_cuda();
    if (rule.momentum == 0.0f) {
      if (cuda) {
        detail::device::sgd(w, g, nullptr, n, rule, false);
      } else {
        for (size_t j = 0; j < n; ++j) detail::rules::sgd_plain(w[j], g[j], rule);
      }
      continue;
    }
    Tensor& buffer = momentum_[i];
    const bool first = buffer.size() != n;  // first step: b = g (torch clones the gradient)
    if (first) {
      buffer = Tensor(p.value.rows(), p.value.cols(), p.device());
    } else {
      follow(buffer, p);
    }
    float* __restrict b = buffer.data();
    if (cuda) {
      detail::device::sgd(w, g, b, n, rule, first);
    } else if (first) {
      for (size_t j = 0; j < n; ++j) detail::rules::sgd_first(w[j], g[j], b[j], rule);
    } else {
      for (size_t j = 0; j < n; ++j) detail::rules::sgd_momentum(w[j], g[j], b[j], rule);
    }
  }
  ++steps_;
}

void SGD::save_state(std::ostream& out) const {
  put_header(out, kind(), steps_, params_.size());
  for (const Tensor& b : momentum_) {
    put<uint8_t>(out, b.empty() ? 0 : 1);
    if (!b.empty()) binary_io::put_tensor(out, b);
  }
}

void SGD::load_state(std::istream& in) {
  const int64_t steps = get_header(in, kind(), params_.size());
  std::vector<Tensor> momentum(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto has = get<uint8_t>(in, "SGD momentum flag");
    if (has > 1) throw Error("SGD state: bad momentum flag");
    if (has != 0) {
      const Tensor& v = params_[i]->value;
      momentum[i] = binary_io::get_tensor(in, v.rows(), v.cols(), "SGD momentum of " + params_[i]->name);
    }
  }
  momentum_ = std::move(momentum);
  steps_ = steps;
}

// ---------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------

AdamW::AdamW(std::vector<Parameter*> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  if (!(options.beta1 >= 0.0f && options.beta1 < 1.0f) || !(options.beta2 >= 0.0f && options.beta2 < 1.0f)) {
    throw InvalidArgument("AdamW: betas must be in [0, 1)");
  }
  if (!(options.eps >= 0.0f)) throw InvalidArgument("AdamW: eps " + std::to_string(options.eps));
  if (!(options.weight_decay >= 0.0f)) {
    throw InvalidArgument("AdamW: weight_decay " + std::to_string(options.weight_decay));
  }
  for (const Parameter* p : params_) {
    m_.emplace_back(p->value.rows(), p->value.cols(), p->device());
    v_.emplace_back(p->value.rows(), p->value.cols(), p->device());
  }
}

void AdamW::step() {
  ++steps_;
  const double t = static_cast<double>(steps_);
  const float beta1 = options_.beta1, beta2 = options_.beta2;
  const detail::rules::AdamW rule{
      .beta1 = beta1,
      .beta2 = beta2,
      .eps = options_.eps,
      .decay = 1.0f - lr_ * options_.weight_decay,
      .step_size = static_cast<float>(lr_ / (1.0 - std::pow(static_cast<double>(beta1), t))),
      .inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(beta2), t))),
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    follow(m_[i], p);
    follow(v_[i], p);
    float* __restrict w = p.value.data();
    const float* __restrict g = p.grad.data();
    float* __restrict m = m_[i].data();
    float* __restrict v = v_[i].data();
    const size_t n = p.numel();
    if (p.value.is_cuda()) {
      detail::device::adamw(w, g, m, v, n, rule);
    } else {
      for (size_t j = 0; j < n; ++j) detail::rules::adamw(w[j], g[j], m[j], v[j], rule);
    }
  }
}

void AdamW::save_state(std::ostream& out) const {
  put_header(out, kind(), steps_, params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    binary_io::put_tensor(out, m_[i]);
    binary_io::put_tensor(out, v_[i]);
  }
}

void AdamW::load_state(std::istream& in) {
  const int64_t steps = get_header(in, kind(), params_.size());
  std::vector<Tensor> m, v;
  for (const Parameter* p : params_) {
    m.push_back(binary_io::get_tensor(in, p->value.rows(), p->value.cols(), "AdamW exp_avg of " + p->name));
    v.push_back(binary_io::get_tensor(in, p->value.rows(), p->value.cols(), "AdamW exp_avg_sq of " + p->name));
  }
  m_ = std::move(m);
  v_ = std::move(v);
  steps_ = steps;
}

}  // namespace ddp
