// The training core's arithmetic, written once for both the host and the GPU.
//
// g++ compiles these into the host loops of nn.cpp and optim.cpp; nvcc compiles the
// same functions into the kernels of device_cuda.cu. So the host tests, which
// check them against PyTorch's formulas, also check what a GPU computes, and a run
// on the GPU follows the host run's rounding step for step: the kernels are built
// without fused multiply-adds (--fmad=false), division and sqrt are correctly
// rounded on both sides, and only exp and log may differ in their last bit.
//
// Only plain C math (expf, logf, sqrtf, log) appears here: nvcc provides it in
// device code, and <math.h> on the host.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define DDP_RULE __host__ __device__ __forceinline__
#else
#define DDP_RULE inline
#endif

namespace ddp::detail::rules {

// --- Activations -------------------------------------------------------------------

DDP_RULE float relu(float x) { return x > 0.0f ? x : 0.0f; }
// The gradient through ReLU from its output y (0 at y == 0, as in PyTorch).
DDP_RULE float relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// --- Softmax cross-entropy, one row --------------------------------------------------

// For logits x[0..classes) with true class `label` (in range: the caller checks):
// writes d[j] = (softmax(x)_j - [j == label]) * inv_batch and returns the row's loss
// -log softmax(x)_label, computed stably (the row's max subtracted first).
DDP_RULE double softmax_xent_row(const float* x, size_t classes, int32_t label, float inv_batch, float* d) {
  float max = x[0];
  for (size_t j = 1; j < classes; ++j) max = x[j] > max ? x[j] : max;
  float sum = 0.0f;
  for (size_t j = 0; j < classes; ++j) {
    d[j] = expf(x[j] - max);
    sum += d[j];
  }
  const double loss = static_cast<double>(max) + log(static_cast<double>(sum)) - static_cast<double>(x[label]);
  const float scale = inv_batch / sum;
  for (size_t j = 0; j < classes; ++j) d[j] *= scale;
  d[label] -= inv_batch;
  return loss;
}

// The index of the row's first maximum (std::max_element's answer).
DDP_RULE size_t argmax_row(const float* x, size_t n) {
  size_t best = 0;
  for (size_t j = 1; j < n; ++j) best = x[j] > x[best] ? j : best;
  return best;
}

// --- Optimizer updates, one element --------------------------------------------------

// torch.optim.SGD, dampening 0, no Nesterov.
struct Sgd {
  float lr;
  float momentum;
  float weight_decay;
};
// Without momentum: w -= lr * (g + wd * w).
DDP_RULE void sgd_plain(float& w, float g, const Sgd& s) { w -= s.lr * (g + s.weight_decay * w); }
// With momentum, on the first step (the buffer starts as the gradient).
DDP_RULE void sgd_first(float& w, float g, float& b, const Sgd& s) {
  b = g + s.weight_decay * w;
  w -= s.lr * b;
}
// With momentum, every later step.
DDP_RULE void sgd_momentum(float& w, float g, float& b, const Sgd& s) {
  b = s.momentum * b + (g + s.weight_decay * w);
  w -= s.lr * b;
}

// torch.optim.AdamW at one step t; the per-step scalars are computed once on the host
// (adamw_step_scalars in optim.cpp) so both sides round them alike.
struct AdamW {
  float beta1;
  float beta2;
  float eps;
  float decay;         // 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^t)
  float inv_bc2_sqrt;  // 1 / sqrt(1 - beta2^t)
};
DDP_RULE void adamw(float& w, float g, float& m, float& v, const AdamW& s) {
  w *= s.decay;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  w -= s.step_size * m / (sqrtf(v) * s.inv_bc2_sqrt + s.eps);
}

}  // namespace ddp::detail::rules
