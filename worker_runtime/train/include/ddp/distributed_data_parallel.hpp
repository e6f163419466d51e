// DistributedDataParallel: data-parallel training of a Module over a ProcessGroup.
//
//   ddp::DistributedDataParallel model(*mlp, pg);    // rank 0's parameters everywhere
//   const auto& logits = model.forward(x);
//   float loss = ddp::softmax_cross_entropy(logits, y, dlogits);
//   model.backward(dlogits);                         // grads averaged over ranks
//   optimizer.step();
//
// Gradients live in flat buckets of the group's memory, reduced (averaged) while
// backward still computes; every rank ends a backward with bit-identical gradients.
// On the GPU (a model moved with Module::to(Device::Cuda) before wrapping it) the
// group needs an NCCL member (backend "nccl" or "cpu+nccl").
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn.hpp"
#include "ddp/process_group.hpp"
#include "ddp/sharding.hpp"

namespace ddp {

class Trace;

// How a bucket's gradients are reduced.
enum class GradReduce : uint8_t {
  // Every rank ends with the whole bucket averaged (all-reduce; with grad_dtype BF16 a
  // widening reduce-scatter then an all-gather of the f32 shards, so ranks stay
  // bit-identical).
  AllReduce,
  // Only this rank's shard of each bucket is reduced (shard_grads); the rest of the
  // bucket holds local gradients. For sharded optimizers (ZeroRedundancyOptimizer).
  ReduceScatter,
};

struct DdpOptions {
  size_t first_bucket_bytes = 1u << 20;  // PyTorch's first bucket: 1 MiB
  size_t bucket_cap_bytes = 25u << 20;   // later buckets: 25 MiB
  bool broadcast_parameters = true;      // copy rank 0's values to every rank at construction
  bool all_reduce = true;                // false: skip the reduction (measurement only)
  // F32, or BF16: each complete bucket is rounded once to bf16 for the wire and reduced
  // in f32 (reduce_scatter bf16 -> f32, in rank order), as PyTorch's bf16_compress_hook
  // but with f32 arithmetic; gradients stay f32 in the buckets.
  DType grad_dtype = DType::F32;
  GradReduce reduce = GradReduce::AllReduce;
  Trace* trace = nullptr;                // records each bucket's reduction when set
};

// Where the time of the last backward() went (seconds).
struct BackwardStats {
  double backward = 0;   // the model's backward pass (compute only)
  double comm_wait = 0;  // communication not hidden behind compute: the last bucket's
                         // all-reduce and the wait for the earlier ones
  int buckets_reduced = 0;
  int buckets_overlapped = 0;  // buckets whose all-reduce started before the last gradient was ready
  double first_launch = -1;    // from the start of backward to the first bucket's launch (-1: none)
  double last_grad_ready = -1; // from the start of backward to the last gradient being ready
  double comm_busy = 0;        // the buckets' reductions as their Work timed them (summed)
  // The share of communication hidden behind compute (0..1; 1 when there was none).
  double hidden() const { return comm_busy > 0 ? std::max(0.0, comm_busy - comm_wait) / comm_busy : 1.0; }
};

class DistributedDataParallel {
 public:
  // Assigns buckets (the first up to first_bucket_bytes, the rest up to
  // bucket_cap_bytes, in reverse registration order), binds every parameter's grad
  // into them (keeping what it held) and, unless disabled, broadcasts rank 0's
  // parameter values. A collective even with the broadcast and the all-reduce
  // switched off: every rank of pg constructs it, in the same order as its other
  // collectives, with the same model structure, device and options. Throws
  // InvalidArgument when the model has no parameters or they are on different
  // devices. After a backward() that threw (a dead peer, a timeout), the gradients
  // are undefined.
  DistributedDataParallel(Module& model, std::shared_ptr<ProcessGroup> pg, const DdpOptions& options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const Tensor& forward(const Tensor& x);
  // The model's backward from dLoss/dOutput, reducing buckets as they fill (unless
  // inside no_sync()). Returns when every gradient is averaged over all ranks. Each
  // such backward (not inside no_sync) counts as one step (ddp/progress.hpp).
  void backward(const Tensor& dy);
  // As backward(dy), and returns dLoss/dInput of the model when need_dx (an empty tensor
  // otherwise): a pipeline stage other than the first sends it to the stage before.
  // Valid until the next backward.
  const Tensor& backward(const Tensor& dy, bool need_dx);

  // While the returned guard lives, backward() only accumulates local gradients;
  // the first backward() after it reduces everything accumulated (gradient
  // accumulation, as torch's no_sync()).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d);
    NoSync(NoSync&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel* d_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Scales every gradient so their global L2 norm is at most max_norm; returns the
  // norm before clipping. Call after backward(): gradients are already identical on
  // every rank, so no communication is needed and every rank clips alike.
  float clip_grad_norm(float max_norm);

  void zero_grad();
  std::vector<Parameter*> parameters();
  Module& module();
  ProcessGroup& process_group();
  const BackwardStats& last_backward() const;
  // How many backward() calls have started (inside no_sync or not): a sharded optimizer
  // that copies gradients out of the buckets knows from it whether they changed.
  uint64_t backwards() const;
  // Bucket layout: the parameter names of each bucket, in bucket order.
  std::vector<std::vector<std::string>> bucket_layout() const;
  size_t num_buckets() const;
  // Bucket i's flat layout (padded to a multiple of the world size when the options
  // reduce-scatter or send bf16; otherwise padded == numel and world 1).
  const FlatGroup& bucket_group(size_t i) const;
  // Bucket i's gradients, 1 × padded (the parameters' grads are views into it).
  Tensor bucket_grads(size_t i);
  // GradReduce::ReduceScatter: this rank's reduced (averaged) shard of bucket i,
  // 1 × group.shard(), valid after backward(). Throws InvalidArgument in AllReduce mode.
  Tensor shard_grads(size_t i);
  // Full values (the model's) and grad buckets, plus reduce-scatter outputs and bf16
  // staging in `comm`; no optimizer state (that is the optimizer's).
  MemoryStats memory() const;
  const DdpOptions& options() const;

 private:
  struct Impl;  // the buckets and the state of a backward (distributed_data_parallel.cpp)
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
