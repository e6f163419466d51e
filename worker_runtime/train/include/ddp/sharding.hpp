// Sharded data parallel, the common part: how parameters are laid out in flat
// groups that ranks split between them, what each rank holds, and the optimizer that
// steps only this rank's shard. ZeroRedundancyOptimizer (ZeRO-1) and
// FullyShardedDataParallel (ZeRO-3) are built on it.
//
// A FlatGroup is a DDP bucket (ZeRO-1) or an FSDP unit (a layer's parameters): its
// parameters laid end to end in one flat buffer, zero-padded to a multiple of the world
// size. Rank r owns elements [r * shard(), (r + 1) * shard()). Padding is zero in values
// and grads and stays zero through SGD and AdamW (an update of 0 with grad 0 is 0); it is
// never written to checkpoints.
//
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <vector>

#include "ddp/optim.hpp"
#include "ddp/process_group.hpp"
#include "ddp/tensor.hpp"

namespace ddp {

struct ShardSlot {
  Parameter* param = nullptr;
  size_t index = 0;   // position in the model's parameters() (checkpoint order)
  size_t offset = 0;  // elements from the start of the group's flat buffer
};

struct FlatGroup {
  std::vector<ShardSlot> slots;
  size_t numel = 0;   // sum of the slots' elements
  size_t padded = 0;  // numel rounded up to a multiple of world
  int world = 1;
  size_t shard() const { return padded / static_cast<size_t>(world); }
  // `numel` rounded up to a multiple of `world` (world >= 1): every layout's padding.
  static size_t padded_for(size_t numel, int world) {
    const auto w = static_cast<size_t>(world);
    return (numel + w - 1) / w * w;
  }
};

// DDP's bucket rule: parameters in reverse registration order (backward produces them
// so), the first group up to first_cap bytes, the others up to cap bytes; each group
// padded for `world`.
std::vector<FlatGroup> bucket_groups(const std::vector<Parameter*>& params, size_t first_cap, size_t cap, int world);

// Bytes this rank holds, from the runtime's own allocations (not RSS).
struct MemoryStats {
  size_t params = 0;          // parameter values kept between steps (padding included)
  size_t grads = 0;           // gradient buffers kept between steps
  size_t optimizer = 0;       // optimizer state (momentum; exp_avg, exp_avg_sq)
  size_t comm = 0;            // bf16 staging and reduce-scatter outputs
  size_t transient_peak = 0;  // FSDP: the most gathered values + unsharded grads alive at once
  size_t held() const { return params + grads + optimizer; }
};

// Builds the optimizer that steps this rank's shards (SGD or AdamW over flat 1 × shard
// parameters: both are elementwise, so a flat shard steps exactly as its pieces would).
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<Parameter*>)>;

// Steps one flat shard parameter per group: this rank's slice of the values, with the
// reduced (averaged) gradients of that slice as its grad. The per-model-parameter state
// format (checkpoints) is assembled from every rank's slices by consolidate_state and
// cut back into them by load_state, at any world size; slot indices say where each
// parameter goes in it.
class ShardedOptimizer : public Optimizer {
 public:
  // `shards[g]`: group g's 1 × shard parameter (value and grad); `make` builds the
  // optimizer that steps them (its lr is this one's). The groups must be laid out for
  // pg's size and their slots' indices number the model's parameters 0..n-1 once each
  // (InvalidArgument otherwise). Not a collective; consolidate_state and clip_grad_norm
  // are.
  ShardedOptimizer(std::vector<FlatGroup> groups, std::vector<Parameter*> shards, std::shared_ptr<ProcessGroup> pg,
                   const OptimizerFactory& make);
  // Steps the shards with lr().
  void step() override;
  const char* kind() const override;
  // The state of the shards (not per model parameter).
  OptimizerState state() const override;
  void set_state(const OptimizerState& state) override;
  // Collective: gathers every rank's state slices to `root`. Then save_state on root
  // writes the per-model-parameter format of an unsharded optimizer in the same state
  // (byte-identical to SGD/AdamW::save_state); on other ranks, and on root once a step
  // or a load changed the state, it throws InvalidArgument. Host memory on the wire.
  void consolidate_state(int root = 0);
  void save_state(std::ostream& out) const override;
  // Reads the per-model-parameter format (any world size, any strategy) and keeps this
  // rank's slice (padding zero). Local: every rank reads the same bytes.
  void load_state(std::istream& in) override;
  // Collective. Clips the global gradient norm (all-reduces the shards' sums of squares;
  // padding is zero) and returns the norm before clipping. Call between the backward
  // and the step it clips.
  float clip_grad_norm(float max_norm);
  const std::vector<FlatGroup>& groups() const { return groups_; }

 protected:
  // Makes the shards' grads hold the reduced gradients of the last backward (for a
  // strategy that keeps them elsewhere); step() and clip_grad_norm() call it first. It
  // must take each backward's gradients once only: a second call for the same backward
  // would undo clip_grad_norm's scaling, and skipping a new backward would step on
  // stale gradients (a step skipped after clipping).
  virtual void refresh_grads() {}
  ProcessGroup& process_group() const { return *pg_; }

 private:
  std::vector<FlatGroup> groups_;
  std::vector<std::pair<size_t, size_t>> shapes_;  // the model's parameters' shapes, by slot index
  std::shared_ptr<ProcessGroup> pg_;
  std::unique_ptr<Optimizer> local_;
  std::unique_ptr<OptimizerState> consolidated_;  // on root after consolidate_state()
  int consolidated_root_ = 0;
};

}  // namespace ddp
