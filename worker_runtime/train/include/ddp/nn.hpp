// Layers and models for batch training: Linear, ReLU, Sequential, an MLP builder,
// and the softmax cross-entropy loss. Each computes on the device its input lives
// on (the host, or the GPU after Module::to(Device::Cuda)).
//
// Inputs and activations are batch × features tensors (row-major). Each module
// keeps its output and input-gradient buffers between steps, so a training step at
// a batch size seen before allocates nothing.
//
// Backward follows PyTorch: parameter gradients ACCUMULATE (grad += ...) until
// zero_grad(). Modules run backward in reverse order, and each one calls the
// grad-ready hook on a parameter as soon as that parameter's gradient for this
// backward is final, before computing the gradient of its input, so a caller (DDP)
// can start reducing a bucket while earlier layers are still in backward.
//
// Activation slots: a pipeline schedule keeps several micro-batches' forwards alive
// and runs their backwards later, in any order. select_slot(i) picks where forward()
// records what backward() needs (the input pointer, the output) and where backward()
// reads it, so slot i's forward and backward pair up whatever ran in other slots in
// between. Slot 0 is the default; a slot's state is made on its first use and kept
// (its buffers reused at a batch size seen before).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/random.hpp"
#include "ddp/tensor.hpp"

namespace ddp {

// Called once per parameter per backward, when its grad is final. May be empty.
using GradReadyHook = std::function<void(Parameter&)>;

class Module {
 public:
  virtual ~Module() = default;

  // Computes the output for input x (batch × in_features) and returns it; the
  // reference stays valid until the next forward(). x must stay alive and unchanged
  // until backward() (modules keep a pointer to it rather than a copy).
  virtual const Tensor& forward(const Tensor& x) = 0;

  // Given dy = dLoss/dOutput of the last forward(), adds this module's parameter
  // gradients into their grads, calls hook(p) for each parameter once its gradient
  // is final (in reverse registration order), and returns dLoss/dInput when need_dx
  // (an empty tensor otherwise; the first layer of a model does not need it).
  // The returned reference stays valid until the next backward().
  virtual const Tensor& backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) = 0;

  // The trainable parameters in registration order (stable pointers: a module never
  // moves its parameters). Empty for modules without any.
  virtual std::vector<Parameter*> parameters() { return {}; }

  // Selects the activation slot the next forward() records into and the next
  // backward() reads (see the top of this file). Containers pass it on to their
  // modules; a layer that keeps activations must keep them per slot().
  virtual void select_slot(size_t slot) { slot_ = slot; }
  size_t slot() const { return slot_; }

  // Sets every parameter's grad to zero.
  void zero_grad();
  // Moves every parameter (value and grad) to `device`, like torch's module.to().
  // Inputs must then live there too; the layers keep their buffers on their input's
  // device. Move a model before building its optimizer and DistributedDataParallel
  // (their state follows the parameters, but bound grads cannot move).
  void to(Device device);
  // Total number of trainable values.
  size_t num_parameters();

 private:
  size_t slot_ = 0;
};

struct LinearOptions {
  size_t in_features = 0;
  size_t out_features = 0;
  bool bias = true;
};

// y = x Wᵀ + b with W: out × in and b: 1 × out (PyTorch's layout and init:
// W and b uniform in [-1/sqrt(in), 1/sqrt(in)], i.e. kaiming_uniform(a=sqrt(5))).
class Linear : public Module {
 public:
  // Draws the initial values from rng (same seed → same model on every rank).
  // Parameter names are "<prefix>weight" and "<prefix>bias".
  Linear(const LinearOptions& options, Rng& rng, const std::string& name_prefix = "");

  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) override;
  std::vector<Parameter*> parameters() override;

  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }  // 0 × 0 when built without bias

 private:
  struct Activations {
    const Tensor* input = nullptr;  // the x of this slot's last forward()
    Tensor output;
  };
  LinearOptions options_;
  Parameter weight_;
  Parameter bias_;
  std::deque<Activations> slots_;  // per slot (a deque: growing it moves no output)
  Tensor dx_;
};

// y = max(x, 0) elementwise (the gradient at 0 is 0, as in PyTorch).
class ReLU : public Module {
 public:
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) override;

 private:
  std::deque<Tensor> outputs_;  // per slot
  Tensor dx_;
};

// Runs its modules in order; backward in reverse order.
class Sequential : public Module {
 public:
  // Appends a module and returns it. Parameter order follows append order.
  template <typename M, typename... Args>
  M& add(Args&&... args) {
    auto m = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *m;
    modules_.push_back(std::move(m));
    return ref;
  }
  Module& append(std::unique_ptr<Module> m);

  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) override;
  std::vector<Parameter*> parameters() override;
  void select_slot(size_t slot) override;

  // backward() for a whole model: no input gradient is computed.
  void backward(const Tensor& dy, const GradReadyHook& hook = {}) { backward(dy, hook, false); }

  size_t size() const { return modules_.size(); }
  Module& operator[](size_t i) { return *modules_[i]; }

 private:
  std::vector<std::unique_ptr<Module>> modules_;
};

struct MlpOptions {
  std::vector<size_t> sizes = {784, 256, 128, 10};  // input, hidden..., output widths
  uint64_t seed = 0;                                // init seed: equal on every rank
};

// Linear → ReLU → ... → Linear (no activation after the last), parameters named
// "<index>.weight" / "<index>.bias" like torch.nn.Sequential. Throws
// InvalidArgument for fewer than two sizes or a zero width.
std::unique_ptr<Sequential> make_mlp(const MlpOptions& options);

// Mean softmax cross-entropy of logits (batch × classes) against integer labels
// (one per row, each in [0, classes)). Writes dLoss/dlogits = (softmax − onehot) /
// batch into dlogits (resized to logits' shape on logits' device; no allocation when
// it has room) and returns the loss. Numerically stable (subtracts each row's max).
// The labels are host memory whatever the device of logits; on the GPU the call
// waits for the queued work, as it hands the loss back.
// Throws InvalidArgument for a label out of range or a batch/label count mismatch.
float softmax_cross_entropy(const Tensor& logits, std::span<const int32_t> labels, Tensor& dlogits);

// How many rows' argmax (the first maximum) equals their label. Throws
// InvalidArgument when the label count differs from the row count. Labels are host
// memory for either device of logits (as for softmax_cross_entropy).
size_t count_correct(const Tensor& logits, std::span<const int32_t> labels);

}  // namespace ddp
