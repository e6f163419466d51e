// FullyShardedDataParallel (ZeRO-3, FSDP's idea): parameters, gradients and
// optimizer state sharded across ranks per unit (a Linear with the parameter-free modules
// after it, or several such layers: FsdpOptions::layers_per_unit).
//
// Each unit keeps only its 1 × shard slice of values and grads (sharding.hpp's FlatGroup
// layout). Forward: wait for the unit's all-gather (issued ahead: `prefetch` units), issue
// the next unit's, bind the gathered buffer to the unit's parameters (Parameter::
// bind_value), run it, release it (reshard_after_forward). Backward, in reverse: gather
// again (prefetched), run the unit's backward into a full-size grad buffer, reduce-scatter
// it asynchronously into the unit's grad shard (average over ranks; bf16 on the wire with
// grad_dtype BF16), release. The optimizer (make_optimizer) steps the shards.
//
//   ddp::FullyShardedDataParallel model(*mlp, pg);
//   auto opt = model.make_optimizer([](auto params) {
//     return std::make_unique<ddp::AdamW>(std::move(params), ddp::AdamWOptions{.lr = 1e-3f}); });
//   const auto& logits = model.forward(x);
//   model.backward(dlogits);
//   opt->step();
//
// Outside forward/backward the model's parameters are released: read or save them inside
// summon_full_params() (a layer refuses a released parameter with InvalidArgument).
//
// The reduction is always a reduce-scatter (f32, or bf16 -> f32 with grad_dtype BF16; at
// world 1 nothing is reduced and nothing rounded, as in DDP and ZeRO-1). Host parameters
// only (a CPU group). Transient memory: 1 + prefetch gathered units (every unit without
// reshard_after_forward) and 2 unsharded grad buffers, allocated once.
// Gradient accumulation: a backward without zero_grad before it reduce-scatters its
// gradients and adds them to the shards (correct, but not bitwise equal to DDP's no_sync).
// Every unit's gathers and reduce-scatters are recorded in options.trace, gathers from
// their issue and reduce-scatters from when they started running, to completion
// ("forward all_gather unit 2", "backward reduce_scatter unit 1"), with the units'
// compute ("forward unit 2", "backward unit 1").
//
// Lifetimes: the model must outlive this object. Its parameters stay released after this
// object is gone (giving them full values back would take a gather, a collective, which a
// destructor cannot do): read them inside summon_full_params before, or keep the FSDP.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>

#include "ddp/nn.hpp"
#include "ddp/process_group.hpp"
#include "ddp/sharding.hpp"

namespace ddp {

class Trace;

struct FsdpOptions {
  size_t layers_per_unit = 1;         // parameterised children of the Sequential per unit
  // true: free each unit's gathered values after its forward (but the last 1 + prefetch
  // units, which backward starts with); false: keep them all from forward to backward.
  bool reshard_after_forward = true;
  int prefetch = 1;                   // units whose all-gather is issued ahead
  DType grad_dtype = DType::F32;      // BF16: rounded once for the reduce-scatter, reduced in f32
  bool broadcast_parameters = true;   // rank 0's initial values everywhere
  Trace* trace = nullptr;
};

// Where the time of the last step went (seconds).
struct FsdpStepStats {
  double forward = 0;    // compute
  double backward = 0;   // compute
  double comm_busy = 0;  // the step's gathers and reduce-scatters, as their Work timed them
  double comm_wait = 0;  // time blocked waiting for them
  // The share of communication hidden behind compute (0..1).
  double hidden() const { return comm_busy > 0 ? std::max(0.0, comm_busy - comm_wait) / comm_busy : 1.0; }
};

class FullyShardedDataParallel {
 public:
  // Collective. Splits `model` into units, keeps this rank's slice of each and releases
  // the full values.
  FullyShardedDataParallel(Sequential& model, std::shared_ptr<ProcessGroup> pg, const FsdpOptions& options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  const Tensor& forward(const Tensor& x);
  // Gradients end reduced (averaged) in each unit's grad shard.
  void backward(const Tensor& dy);
  // As backward(dy), and returns dLoss/dInput of the model when need_dx (empty otherwise;
  // valid until the next backward): what a pipeline stage sends to the stage before.
  // Each activation slot's backward needs that slot's forward before it (a pipeline runs
  // several micro-batches' forwards first: Module::select_slot).
  const Tensor& backward(const Tensor& dy, bool need_dx);
  void zero_grad();
  std::unique_ptr<ShardedOptimizer> make_optimizer(const OptimizerFactory& make);

  // RAII: the full values gathered and bound to the model's parameters (on `root` only,
  // or on every rank when nullopt), released again when it goes. Inside it,
  // save_checkpoint(path, module(), ...) and parameter hashes work as for DDP. The guard
  // holds a plain pointer to this FSDP and the gathered buffers are the FSDP's: it must
  // not outlive the FullyShardedDataParallel that made it.
  class FullParams {
   public:
    FullParams(FullParams&&) noexcept;
    ~FullParams();

   private:
    friend class FullyShardedDataParallel;
    explicit FullParams(FullyShardedDataParallel* owner);
    FullyShardedDataParallel* owner_;
  };
  FullParams summon_full_params(std::optional<int> root = 0);

  MemoryStats memory() const;
  const FsdpStepStats& last_step() const;
  Sequential& module();
  size_t num_units() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
