// What fsdp_checks.cpp (the checks) and fsdp_bench.cpp (its --bench mode) share beyond
// launched_checks.hpp: the optimizers both strategies are built with.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/optim.hpp"
#include "ddp/process_group.hpp"
#include "ddp/tensor.hpp"
#include "launched_checks.hpp"

namespace fsdp_checks {

using launched::g_rank;

// A batch for an MLP of `sizes` that differs per rank and per step.
inline void fill_batch(ddp::Tensor& x, std::vector<int32_t>& y, size_t batch, const std::vector<size_t>& sizes, int rank,
                       int step) {
  launched::fill_batch(x, y, batch, sizes.front(), sizes.back(), rank, step);
}

using Factory = std::function<std::unique_ptr<ddp::Optimizer>(std::vector<ddp::Parameter*>)>;
// "adamw" (lr 1e-3, weight decay 0.01) or "sgd" (lr 0.05, momentum 0.9, weight decay 1e-4).
Factory optimizer(const std::string& kind);

// --bench: DDP and FSDP variants on the wide model, interleaved; prints medians.
void bench(const std::shared_ptr<ddp::ProcessGroup>& pg, int rounds);

}  // namespace fsdp_checks
