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
#include <utility>
#include <vector>

#include "ddp/tensor.hpp"

namespace ddp {

// An optimizer's whole state as values, per parameter: what save_state writes, and what
// sharded optimizers slice and assemble without parsing bytes.
struct OptimizerState {
  std::string kind;  // "sgd", "adamw"
  int64_t steps = 0;
  // buffers[k][i]: state buffer k of parameter i, shaped like that parameter (sgd:
  // {momentum}; adamw: {exp_avg, exp_avg_sq}). An empty tensor where a buffer does not
  // exist yet (SGD's momentum before its first step with momentum). Host or device.
  std::vector<std::vector<Tensor>> buffers;
};

// The byte format of save_state: a header (kind, step count, parameter count), then per
// parameter its buffers in order (SGD: a u8 "has momentum" flag before the optional
// buffer). Unknown kinds throw InvalidArgument.
void write_optimizer_state(std::ostream& out, const OptimizerState& state);
// Reads what write_optimizer_state wrote, checking it against `kind` and the parameters'
// shapes (rows, cols). Throws ddp::Error on a truncated stream or a mismatch.
OptimizerState read_optimizer_state(std::istream& in, const std::string& kind,
                                    const std::vector<std::pair<size_t, size_t>>& shapes);

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
  virtual void save_state(std::ostream& out) const;
  // Reads what save_state() wrote, for the same parameter shapes. Throws ddp::Error
  // on a truncated stream or a mismatch (other kind, buffer count or sizes) and then
  // leaves the current state unchanged.
  virtual void load_state(std::istream& in);

  // The state as values. The tensors are views of the optimizer's own buffers: valid
  // until the next step() or set_state(), not to be written through.
  virtual OptimizerState state() const = 0;
  // Replaces the state (copied in). Throws ddp::Error for another kind, buffer count or
  // shape, and then leaves the current state unchanged.
  virtual void set_state(const OptimizerState& state) = 0;
  // Bytes of state buffers this optimizer holds now (for memory accounting).
  size_t state_bytes() const;
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
  OptimizerState state() const override;
  void set_state(const OptimizerState& state) override;

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
  OptimizerState state() const override;
  void set_state(const OptimizerState& state) override;

  const AdamWOptions& options() const { return options_; }
  const Tensor& exp_avg(size_t i) const { return m_[i]; }     // first moment m
  const Tensor& exp_avg_sq(size_t i) const { return v_[i]; }  // second moment v

 private:
  AdamWOptions options_;
  std::vector<Tensor> m_;
  std::vector<Tensor> v_;
};

}  // namespace ddp
