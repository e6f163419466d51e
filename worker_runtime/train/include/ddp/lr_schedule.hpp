// Learning-rate schedules: linear warmup then cosine decay, and the linear scaling
// rule for data-parallel training.
#pragma once

#include <cstdint>

namespace ddp {

struct WarmupCosineOptions {
  double base_lr = 0.1;      // peak learning rate, reached at the end of warmup
  int64_t warmup_steps = 0;  // steps of linear warmup (0: start at base_lr)
  int64_t total_steps = 1;   // warmup + decay; from here on the rate is min_lr
  double min_lr = 0.0;       // floor of the cosine decay
};

class WarmupCosine {
 public:
  // Throws InvalidArgument unless 0 <= warmup_steps <= total_steps, total_steps > 0
  // and 0 <= min_lr <= base_lr.
  explicit WarmupCosine(const WarmupCosineOptions& options);

  // The rate for optimizer step `step` (0-based):
  //   step < warmup:          base_lr * (step + 1) / warmup_steps
  //   warmup <= step < total: min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2,
  //                           p = (step - warmup) / (total - warmup)
  //   step >= total:          min_lr
  // Negative steps are treated as 0.
  double lr_at(int64_t step) const;

  const WarmupCosineOptions& options() const { return options_; }

 private:
  WarmupCosineOptions options_;
};

// Linear scaling rule (Goyal et al.): a learning rate tuned for one worker's batch,
// scaled for world_size workers each with that batch: base_lr * world_size.
// Throws InvalidArgument for world_size < 1.
double scaled_lr(double base_lr, int world_size);

// The same rule stated with batches: base_lr * global_batch / base_batch, where
// base_lr was tuned at base_batch. Throws InvalidArgument unless both are > 0.
double scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch);

}  // namespace ddp
