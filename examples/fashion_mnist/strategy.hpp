// How fashion_mnist spreads training over its ranks: DDP (every rank holds everything),
// ZeRO-1 (optimizer state sharded) or FSDP (parameters, gradients and optimizer state
// sharded). The training loop, evaluation, checkpoints and the final hash all go
// through this interface, because under FSDP the model's own values are released
// between uses and only the strategy knows how to reach them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddp/checkpoint.hpp"  // CheckpointInfo
#include "ddp/nn.hpp"          // Sequential
#include "ddp/optim.hpp"       // Optimizer
#include "ddp/process_group.hpp"
#include "ddp/sharding.hpp"    // MemoryStats, OptimizerFactory

namespace ddp {
class Trace;
}

namespace fashion_mnist {

struct StrategyOptions {
  std::string kind = "ddp";  // ddp, zero1, fsdp
  ddp::DType grad_dtype = ddp::DType::F32;
  bool all_reduce = true;    // ddp only: false skips the reduction (measurement)
  size_t first_bucket_bytes = 1u << 20;
  size_t bucket_cap_bytes = 25u << 20;
  ddp::Trace* trace = nullptr;
};

// What the last backward's communication cost (seconds) and how much of it compute hid.
struct CommStats {
  double wait = 0;    // blocked on communication
  double busy = 0;    // the communication itself, as its Work timed it
  double hidden = 1;  // share hidden behind compute (0..1; 1 when there was none)
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual const ddp::Tensor& forward(const ddp::Tensor& x) = 0;
  // sync false: only accumulate local gradients (a micro-batch before the step's last).
  // FSDP reduces every micro-batch (its gradients live in shards). need_dx: returns
  // dLoss/dInput of the model (a pipeline stage after the first sends it back); an empty
  // tensor otherwise.
  virtual const ddp::Tensor& backward(const ddp::Tensor& dy, bool sync, bool need_dx) = 0;
  void backward(const ddp::Tensor& dy, bool sync) { backward(dy, sync, false); }
  virtual CommStats last_comm() const = 0;
  // The optimizer that steps this rank's part (the full model's for DDP).
  virtual ddp::Optimizer& optimizer() = 0;
  // Optimizer step, then gradients zeroed.
  virtual void step() = 0;
  // Clips the global gradient norm (after backward); returns the norm before clipping.
  virtual float clip_grad_norm(float max_norm) = 0;
  // For a norm over more than this strategy's group (model parallelism): collective over
  // the group, the sum of the squared reduced gradients of the parameters `counted`
  // keeps, this rank's part of it: summed over the group it is the whole (rank 0 alone
  // where every rank holds the same gradients, each rank its shard where they are
  // sharded). Then scale_grads multiplies what this rank holds by `factor`.
  virtual double grad_squares(const std::function<bool(const ddp::Parameter&)>& counted) = 0;
  virtual void scale_grads(float factor) = 0;
  // Collective over the group: calls `use` on every rank with the module and the
  // optimizer; where `root` (rank 0 of the group) the module holds the full values and
  // the optimizer's save_state writes the whole per-parameter state (sharded state
  // gathered first). Elsewhere the values may be released and the state partial.
  using FullStateUse = std::function<void(ddp::Module& module, const ddp::Optimizer& optimizer, bool root)>;
  virtual void with_full_state(const FullStateUse& use) = 0;
  // As with_full_state, the parameters only: where `root` the module holds the full
  // values; no optimizer state is gathered (hashes, parameter dumps).
  using FullParamsUse = std::function<void(ddp::Module& module, bool root)>;
  virtual void with_full_params(const FullParamsUse& use) = 0;
  // Collective: rank 0 writes the full checkpoint (the same v2 file for every strategy).
  virtual void save_checkpoint(const std::string& path, const ddp::CheckpointInfo& info) = 0;
  // Collective: FNV-1a of every full parameter's bytes, on every rank.
  virtual uint64_t params_hash() = 0;
  // Collective: rank 0 writes every full parameter as raw float32.
  virtual void write_params(const std::string& path) = 0;
  // Bytes this rank holds (the runtime's accounting, optimizer state included).
  virtual ddp::MemoryStats memory() const = 0;
};

// FNV-1a of every parameter's bytes, in order (host copies of device values).
uint64_t hash_parameters(ddp::Module& m);
// Writes every parameter's values, in order, as raw float32. Throws ddp::Error naming path.
void write_parameters(ddp::Module& m, const std::string& path);

// Collective (every rank of pg, same options). `model` is already loaded (a resumed
// checkpoint's values go in before wrapping); `make` builds the optimizer over the
// parameters the strategy steps. Throws InvalidArgument for an unknown kind, or a
// sharded kind with a model on the GPU (host only for now).
std::unique_ptr<Strategy> make_strategy(const StrategyOptions& options, ddp::Sequential& model,
                                        std::shared_ptr<ddp::ProcessGroup> pg, const ddp::OptimizerFactory& make);

}  // namespace fashion_mnist
