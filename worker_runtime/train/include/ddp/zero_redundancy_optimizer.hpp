// ZeRO-1: each rank keeps optimizer state only for its shard of every DDP
// bucket, steps that shard after the gradients are reduced, and all-gathers the updated
// shards into every rank's parameters.
//
//   ddp::DistributedDataParallel model(*mlp, pg, {.reduce = ddp::GradReduce::ReduceScatter});
//   ddp::ZeroRedundancyOptimizer opt(model, [](auto params) {
//     return std::make_unique<ddp::AdamW>(std::move(params), ddp::AdamWOptions{.lr = 1e-3f}); });
//   model.backward(dlogits);  // reduce-scatter per bucket (or all-reduce: ZeroOptions)
//   opt.step();               // step the shard, all-gather the values
//   model.zero_grad();        // the DDP's buckets (the optimizer's zero_grad() only
//                             // clears its shards' grads)
//
// The DDP must outlive the optimizer; while the optimizer lives, the model's parameter
// values are views into its flat per-bucket buffers (its destructor gives the
// parameters owning copies back).
#pragma once

#include "ddp/distributed_data_parallel.hpp"
#include "ddp/sharding.hpp"

namespace ddp {

struct ZeroOptions {
  // true: DDP reduce-scatters each bucket (each rank gets only its shard reduced: half
  // the traffic of an all-reduce); the DDP must have been built with
  // DdpOptions::reduce = GradReduce::ReduceScatter. false: DDP all-reduces (its default,
  // GradReduce::AllReduce) and each rank copies its slice out of the reduced bucket.
  // DdpOptions are fixed at construction, so the DDP is built for ZeRO, not switched
  // by it; a mismatch is an InvalidArgument naming both settings.
  bool reduce_scatter = true;
};

class ZeroRedundancyOptimizer : public ShardedOptimizer {
 public:
  // Every rank builds it, after the DDP (whose values are then equal everywhere). Binds
  // every parameter's value into a flat buffer per DDP bucket, laid out like that
  // bucket's grads and padded to a multiple of the world size; `make` builds the
  // optimizer of this rank's 1 x shard slices. Throws InvalidArgument when `options`
  // does not match the DDP's reduction mode.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const OptimizerFactory& make, const ZeroOptions& options = {});
  ~ZeroRedundancyOptimizer() override;
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;
  // Collective. Steps this rank's shards, then all-gathers each bucket's values in
  // place (async, all waited for before returning): every rank ends with the same values.
  void step() override;
  // Full values (padded) and grad buckets, 1/N of the optimizer state (plus padding),
  // reduce-scatter outputs (or, all-reduce mode, the copied grad slices) in `comm`.
  MemoryStats memory() const;

 protected:
  void refresh_grads() override;

 private:
  // The flat buffers, made before the ShardedOptimizer base takes the shards.
  struct Flat {
    std::vector<FlatGroup> groups;                    // per DDP bucket, padded for the world
    std::vector<std::unique_ptr<GroupMemory>> memory; // host buckets' value buffers (ProcessGroup::allocate)
    std::vector<Tensor> values;                       // per bucket: 1 x padded; the values are views into it
    std::vector<std::unique_ptr<Parameter>> shards;   // per bucket: 1 x shard, value a view of block rank()
  };
  static Flat lay_out(DistributedDataParallel& ddp, const ZeroOptions& options);
  static std::vector<Parameter*> pointers(const Flat& flat);
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const OptimizerFactory& make, const ZeroOptions& options,
                          Flat flat);

  DistributedDataParallel& ddp_;
  ZeroOptions options_;
  Flat flat_;
  uint64_t refreshed_for_ = 0;  // the DDP's backwards() whose gradients the shards hold
};

}  // namespace ddp
