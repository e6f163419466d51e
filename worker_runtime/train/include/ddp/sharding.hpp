// Sharded data parallel, the common part (issue 16): how parameters are laid out in flat
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
// STATUS: contract only (declarations). Implementations come with issue 16's work;
// nothing links against these yet.
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
// reduced (averaged) gradients of that slice as its grad.
class ShardedOptimizer : public Optimizer {
 public:
  // `shards[g]`: group g's 1 × shard parameter (value and grad). Collective only in
  // consolidate_state / load_state.
  ShardedOptimizer(std::vector<FlatGroup> groups, std::vector<Parameter*> shards, std::shared_ptr<ProcessGroup> pg,
                   const OptimizerFactory& make);
  void step() override;
  const char* kind() const override;
  // The state of the shards (not per model parameter).
  OptimizerState state() const override;
  void set_state(const OptimizerState& state) override;
  // Collective: gathers every rank's state slices to `root`. Then save_state on root
  // writes the per-model-parameter format of an unsharded optimizer in the same state
  // (byte-identical to SGD/AdamW::save_state); on other ranks it throws InvalidArgument.
  void consolidate_state(int root = 0);
  void save_state(std::ostream& out) const override;
  // Reads the per-model-parameter format (any world size, any strategy) and keeps this
  // rank's slice.
  void load_state(std::istream& in) override;
  // Clips the global gradient norm: all-reduces the shards' sums of squares.
  float clip_grad_norm(float max_norm);
  const std::vector<FlatGroup>& groups() const { return groups_; }

 private:
  std::vector<FlatGroup> groups_;
  std::shared_ptr<ProcessGroup> pg_;
  std::unique_ptr<Optimizer> local_;
  std::unique_ptr<OptimizerState> consolidated_;  // on root after consolidate_state()
};

}  // namespace ddp
