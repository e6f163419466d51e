// What fsdp_checks.cpp (the checks) and fsdp_bench.cpp (its --bench mode) share: the
// synthetic per-rank batches and the optimizers both strategies are built with.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/optim.hpp"
#include "ddp/process_group.hpp"
#include "ddp/tensor.hpp"

namespace fsdp_checks {

extern int g_rank;

// A batch that differs per rank and per step: inputs in [-1, 1), labels below sizes.back().
void fill_batch(ddp::Tensor& x, std::vector<int32_t>& y, size_t batch, const std::vector<size_t>& sizes, int rank,
                int step);

using Factory = std::function<std::unique_ptr<ddp::Optimizer>(std::vector<ddp::Parameter*>)>;
// "adamw" (lr 1e-3, weight decay 0.01) or "sgd" (lr 0.05, momentum 0.9, weight decay 1e-4).
Factory optimizer(const std::string& kind);

// --bench: DDP and FSDP variants on the wide model, interleaved; prints medians.
void bench(const std::shared_ptr<ddp::ProcessGroup>& pg, int rounds);

}  // namespace fsdp_checks
