// ZeRO-1 (issue 16): each rank keeps optimizer state only for its shard of every DDP
// bucket, steps that shard after the gradients are reduced, and all-gathers the updated
// shards into every rank's parameters.
//
//   ddp::DistributedDataParallel model(*mlp, pg);
//   ddp::ZeroRedundancyOptimizer opt(model, [](auto params) {
//     return std::make_unique<ddp::AdamW>(std::move(params), ddp::AdamWOptions{.lr = 1e-3f}); });
//   model.backward(dlogits);  // reduce-scatter per bucket (or all-reduce: ZeroOptions)
//   opt.step();               // step the shard, all-gather the values
//
// STATUS: contract only (declarations); see sharding.hpp.
#pragma once

#include "ddp/distributed_data_parallel.hpp"
#include "ddp/sharding.hpp"

namespace ddp {

struct ZeroOptions {
  // true: DDP reduce-scatters each bucket (each rank gets only its shard reduced: half
  // the traffic of an all-reduce); false: DDP all-reduces and each rank reads its slice.
  bool reduce_scatter = true;
};

class ZeroRedundancyOptimizer : public ShardedOptimizer {
 public:
  // Collective. Binds every parameter's value into a flat padded buffer per DDP bucket,
  // laid out like that bucket's grads, and sets DDP's reduction mode.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const OptimizerFactory& make, const ZeroOptions& options = {});
  // Steps this rank's shards, then all-gathers each bucket's values in place (async,
  // all waited for before returning): every rank ends with the same values.
  void step() override;
  // Full values and grads, 1/N of the optimizer state (plus padding), reduce-scatter outputs.
  MemoryStats memory() const;
};

}  // namespace ddp
