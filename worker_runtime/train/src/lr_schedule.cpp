// WarmupCosine and the linear scaling rule.
#include "ddp/lr_schedule.hpp"

#include <cmath>
#include <numbers>
#include <string>

#include "ddp/types.hpp"

namespace ddp {

WarmupCosine::WarmupCosine(const WarmupCosineOptions& options) : options_(options) {
  if (options.total_steps <= 0 || options.warmup_steps < 0 || options.warmup_steps > options.total_steps) {
    throw InvalidArgument("WarmupCosine: need 0 <= warmup_steps (" + std::to_string(options.warmup_steps) +
                          ") <= total_steps (" + std::to_string(options.total_steps) + ") and total_steps > 0");
  }
  if (!(options.min_lr >= 0.0 && options.min_lr <= options.base_lr)) {
    throw InvalidArgument("WarmupCosine: need 0 <= min_lr (" + std::to_string(options.min_lr) + ") <= base_lr (" +
                          std::to_string(options.base_lr) + ")");
  }
}

double WarmupCosine::lr_at(int64_t step) const {
  const auto& o = options_;
  if (step < 0) step = 0;
  if (step < o.warmup_steps) {
    return o.base_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  if (step >= o.total_steps) return o.min_lr;
  const double progress =
      static_cast<double>(step - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps);
  return o.min_lr + (o.base_lr - o.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double scaled_lr(double base_lr, int world_size) {
  if (world_size < 1) throw InvalidArgument("scaled_lr: world size " + std::to_string(world_size));
  return base_lr * world_size;
}

double scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch) {
  if (global_batch <= 0 || base_batch <= 0) {
    throw InvalidArgument("scaled_lr: batches must be positive (global " + std::to_string(global_batch) +
                          ", base " + std::to_string(base_batch) + ")");
  }
  return base_lr * static_cast<double>(global_batch) / static_cast<double>(base_batch);
}

}  // namespace ddp
