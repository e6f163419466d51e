// Optimizers with PyTorch's update rules: SGD (momentum, weight decay) and AdamW.
//
// An optimizer holds pointers to the parameters it updates (they must outlive it)
// and per-parameter state, kept on each parameter's device (the update runs there:
// a loop on the host, a kernel on the GPU, both from the same rules). step() reads each parameter's grad and updates its
// value; it never touches grads (call zero_grad() between steps). The state (step
// count, momentum / moment buffers) saves to and loads from a byte stream so
// checkpoints can resume training exactly.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "ddp/tensor.hpp"

namespace ddp {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Parameter*> params, float lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update to every parameter from its current grad.
  virtual void step() = 0;
  // Short identifier of the algorithm ("sgd", "adamw"), stored in checkpoints.
  virtual const char* kind() const = 0;

  // Writes the state (step count and buffers) to out in a binary format.
  virtual void save_state(std::ostream& out) const = 0;
  // Reads what save_state() wrote, for the same parameter shapes. Throws ddp::Error
  // on a truncated stream or a mismatch (other kind, buffer count or sizes) and then
  // leaves the current state unchanged.
  virtual void load_state(std::istream& in) = 0;

  // Sets every parameter's grad to zero.
  void zero_grad();
  // The learning rate the next step() uses (change it per step for a schedule).
  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  // Number of step() calls so far (restored by load_state).
  int64_t steps() const { return steps_; }
  const std::vector<Parameter*>& params() const { return params_; }

 protected:
  std::vector<Parameter*> params_;
  float lr_;
  int64_t steps_ = 0;
};

// torch.optim.SGD with dampening = 0 and nesterov = False:
//   g = grad + weight_decay * p
//   b = g on the first step, then b = momentum * b + g     (only when momentum != 0)
//   p = p - lr * b                                          (or lr * g without momentum)
struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Parameter*> params, const SgdOptions& options);
  void step() override;
  const char* kind() const override { return "sgd"; }
  void save_state(std::ostream& out) const override;
  void load_state(std::istream& in) override;

  const SgdOptions& options() const { return options_; }
  // The momentum buffer of parameter i (empty until the first step with momentum).
  const Tensor& momentum_buffer(size_t i) const { return momentum_[i]; }

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_;
};

// torch.optim.AdamW (amsgrad = False), at step t = 1, 2, ...:
//   p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g²
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Parameter*> params, const AdamWOptions& options);
  void step() override;
  const char* kind() const override { return "adamw"; }
  void save_state(std::ostream& out) const override;
  void load_state(std::istream& in) override;

  const AdamWOptions& options() const { return options_; }
  const Tensor& exp_avg(size_t i) const { return m_[i]; }     // first moment m
  const Tensor& exp_avg_sq(size_t i) const { return v_[i]; }  // second moment v

 private:
  AdamWOptions options_;
  std::vector<Tensor> m_;
  std::vector<Tensor> v_;
};

}  // namespace ddp
