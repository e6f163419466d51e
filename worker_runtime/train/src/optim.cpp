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

// Buffers per parameter of each kind, and whether they may be absent (SGD's momentum
// before its first step with momentum: a u8 flag in the byte format says which).
struct KindLayout {
  size_t buffers;
  bool optional;
};

KindLayout layout_of(const std::string& kind) {
  if (kind == "sgd") return {1, true};
  if (kind == "adamw") return {2, false};
  throw InvalidArgument("optimizer state: unknown kind '" + kind + "'");
}

const char* buffer_name(const std::string& kind, size_t k) {
  if (kind == "sgd") return "SGD momentum";
  return k == 0 ? "AdamW exp_avg" : "AdamW exp_avg_sq";
}

// A read-only view of an optimizer's own buffer (state() hands out views, not copies).
Tensor view_of(const Tensor& t) {
  if (t.empty()) return Tensor();
  return Tensor::view(const_cast<float*>(t.data()), t.rows(), t.cols(), t.device());
}

// All-or-nothing checks for set_state: kind, buffer count and every shape.
void check_state(const OptimizerState& st, const char* kind, size_t buffers, const std::vector<Parameter*>& params,
                 bool optional) {
  if (st.kind != kind) {
    throw Error("optimizer state is for '" + st.kind + "', this optimizer is '" + kind + "'");
  }
  if (st.steps < 0) throw Error(std::string("optimizer state has a negative step count"));
  if (st.buffers.size() != buffers) throw Error(std::string("optimizer state has another number of buffers"));
  for (const auto& per_param : st.buffers) {
    if (per_param.size() != params.size()) {
      throw Error("optimizer state has " + std::to_string(per_param.size()) + " parameters, this optimizer has " +
                  std::to_string(params.size()));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& b = per_param[i];
      if (optional && b.empty()) continue;
      if (b.rows() != params[i]->value.rows() || b.cols() != params[i]->value.cols()) {
        throw Error("optimizer state of " + params[i]->name + " has another shape");
      }
    }
  }
}

// AdamW's host loop, also compiled for AVX2 where GCC can pick the version at load time
// (target_clones): 8 lanes instead of SSE2's 4, about 9% less time on a loop that is
// mostly memory-bound (7 streams of 4 bytes per parameter). AVX2 brings no fused
// multiply-add (that is -mfma, and fp-contract is off here in any case), and mul, add,
// div and sqrt round alike at any width: the bits are the baseline loop's.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define DDP_HOST_CLONES __attribute__((target_clones("avx2", "default"), optimize("fp-contract=off")))
#else
#define DDP_HOST_CLONES
#endif
DDP_HOST_CLONES void adamw_host(float* __restrict w, const float* __restrict g, float* __restrict m,
                                float* __restrict v, size_t n, const detail::rules::AdamW& rule) {
  for (size_t j = 0; j < n; ++j) detail::rules::adamw(w[j], g[j], m[j], v[j], rule);
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

size_t Optimizer::state_bytes() const {
  size_t bytes = 0;
  for (const auto& per_param : state().buffers) {
    for (const Tensor& b : per_param) bytes += b.size() * sizeof(float);
  }
  return bytes;
}

void Optimizer::save_state(std::ostream& out) const { write_optimizer_state(out, state()); }

void Optimizer::load_state(std::istream& in) {
  std::vector<std::pair<size_t, size_t>> shapes;
  for (const Parameter* p : params_) shapes.emplace_back(p->value.rows(), p->value.cols());
  set_state(read_optimizer_state(in, kind(), shapes));
}

void write_optimizer_state(std::ostream& out, const OptimizerState& state) {
  const KindLayout layout = layout_of(state.kind);
  const size_t count = state.buffers.empty() ? 0 : state.buffers[0].size();
  if (state.buffers.size() != layout.buffers) throw InvalidArgument("optimizer state: wrong number of buffers");
  binary_io::put_string(out, state.kind);
  put<int64_t>(out, state.steps);
  put<uint64_t>(out, count);
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < layout.buffers; ++k) {
      const Tensor& b = state.buffers[k].at(i);
      if (layout.optional) put<uint8_t>(out, b.empty() ? 0 : 1);
      if (!layout.optional || !b.empty()) binary_io::put_tensor(out, b);
    }
  }
}

OptimizerState read_optimizer_state(std::istream& in, const std::string& kind,
                                    const std::vector<std::pair<size_t, size_t>>& shapes) {
  const KindLayout layout = layout_of(kind);
  OptimizerState state;
  state.kind = binary_io::get_string(in, "optimizer kind", 64);
  if (state.kind != kind) {
    throw Error("optimizer state is for '" + state.kind + "', this optimizer is '" + kind + "'");
  }
  state.steps = get<int64_t>(in, "optimizer step count");
  if (state.steps < 0) throw Error(std::string("optimizer state has a negative step count"));
  const auto n = get<uint64_t>(in, "optimizer parameter count");
  if (n != shapes.size()) {
    throw Error(std::string("optimizer state has ") + std::to_string(n) + " parameters, this optimizer has " +
                std::to_string(shapes.size()));
  }
  state.buffers.assign(layout.buffers, std::vector<Tensor>(shapes.size()));
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (size_t k = 0; k < layout.buffers; ++k) {
      if (layout.optional) {
        const auto has = get<uint8_t>(in, "SGD momentum flag");
        if (has > 1) throw Error("SGD state: bad momentum flag");
        if (has == 0) continue;
      }
      state.buffers[k][i] = binary_io::get_tensor(in, shapes[i].first, shapes[i].second,
                                                  std::string(buffer_name(kind, k)) + " of parameter " +
                                                      std::to_string(i));
    }
  }
  return state;
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

OptimizerState SGD::state() const {
  OptimizerState st{kind(), steps_, {{}}};
  for (const Tensor& b : momentum_) st.buffers[0].push_back(view_of(b));
  return st;
}

void SGD::set_state(const OptimizerState& state) {
  check_state(state, kind(), 1, params_, /*optional=*/true);
  momentum_ = state.buffers[0];
  steps_ = state.steps;
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
      adamw_host(w, g, m, v, n, rule);
    }
  }
}

OptimizerState AdamW::state() const {
  OptimizerState st{kind(), steps_, {{}, {}}};
  for (size_t i = 0; i < params_.size(); ++i) {
    st.buffers[0].push_back(view_of(m_[i]));
    st.buffers[1].push_back(view_of(v_[i]));
  }
  return st;
}

void AdamW::set_state(const OptimizerState& state) {
  check_state(state, kind(), 2, params_, /*optional=*/false);
  m_ = state.buffers[0];
  v_ = state.buffers[1];
  steps_ = state.steps;
}

}  // namespace ddp
