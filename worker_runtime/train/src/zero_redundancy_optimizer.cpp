// ZeRO-1 over DistributedDataParallel: the flat value buffers that mirror DDP's grad
// buckets, the shards' grads taken from the reduced buckets, and the in-place
// all-gather of the updated shards after each step.
#include "ddp/zero_redundancy_optimizer.hpp"

#include <algorithm>
#include <string>

#include "ddp/types.hpp"

namespace ddp {
namespace {

Buffer buffer_of(float* data, size_t count, Device device) { return Buffer{data, count, DType::F32, device}; }

}  // namespace

ZeroRedundancyOptimizer::Flat ZeroRedundancyOptimizer::lay_out(DistributedDataParallel& ddp,
                                                               const ZeroOptions& options) {
  const bool rs = ddp.options().reduce == GradReduce::ReduceScatter;
  if (options.reduce_scatter != rs) {
    throw InvalidArgument(std::string("ZeroRedundancyOptimizer: ZeroOptions::reduce_scatter is ") +
                          (options.reduce_scatter ? "true" : "false") + " but the DistributedDataParallel was built with " +
                          (rs ? "GradReduce::ReduceScatter" : "GradReduce::AllReduce") +
                          " (build it with DdpOptions::reduce = " +
                          (options.reduce_scatter ? "GradReduce::ReduceScatter" : "GradReduce::AllReduce") + ")");
  }
  ProcessGroup& pg = ddp.process_group();
  const auto rank = static_cast<size_t>(pg.rank());
  Flat flat;
  for (size_t i = 0; i < ddp.num_buckets(); ++i) {
    FlatGroup g = ddp.bucket_group(i);
    // An all-reduced bucket is not padded (world 1): pad its value buffer here. The
    // grads stay DDP's; refresh_grads copies this rank's slice out of them.
    g.world = pg.size();
    g.padded = FlatGroup::padded_for(g.numel, pg.size());
    const Device device = g.slots.front().param->device();
    // Zero-filled, so padding stays zero. Host buffers are group memory: on one host the
    // all-gather after each step then reads the peers' blocks in place.
    Tensor values;
    if (device == Device::Cpu) {
      flat.memory.push_back(pg.allocate(g.padded * sizeof(float)));
      values = Tensor::view(reinterpret_cast<float*>(flat.memory.back()->data()), 1, g.padded);
    } else {
      values = Tensor(1, g.padded, device);
      values.zero();
    }
    for (const ShardSlot& s : g.slots) {
      Tensor::view(values.data() + s.offset, s.param->rows(), s.param->cols(), device).copy_from(s.param->value);
    }
    auto shard = std::make_unique<Parameter>("zero.bucket" + std::to_string(i) + ".shard", 1, g.shard(), device);
    shard->value = Tensor::view(values.data() + rank * g.shard(), 1, g.shard(), device);
    flat.groups.push_back(std::move(g));
    flat.values.push_back(std::move(values));
    flat.shards.push_back(std::move(shard));
  }
  return flat;
}

std::vector<Parameter*> ZeroRedundancyOptimizer::pointers(const Flat& flat) {
  std::vector<Parameter*> out;
  for (const auto& s : flat.shards) out.push_back(s.get());
  return out;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const OptimizerFactory& make,
                                                 const ZeroOptions& options)
    : ZeroRedundancyOptimizer(ddp, make, options, lay_out(ddp, options)) {}

// The group is the DDP's (a non-owning pointer: the DDP outlives this optimizer).
ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const OptimizerFactory& make,
                                                 const ZeroOptions& options, Flat flat)
    : ShardedOptimizer(flat.groups, pointers(flat), std::shared_ptr<ProcessGroup>(std::shared_ptr<ProcessGroup>(), &ddp.process_group()),
                       make),
      ddp_(ddp),
      options_(options),
      flat_(std::move(flat)) {  // moving the vectors keeps every buffer where it is
  // Only now that nothing can throw: the parameters' values become views of the flat
  // buffers (already holding the same values).
  for (size_t i = 0; i < flat_.groups.size(); ++i) {
    for (const ShardSlot& s : flat_.groups[i].slots) s.param->bind_value(flat_.values[i].data() + s.offset, false);
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  // The model outlives this optimizer: give its parameters their values back.
  for (const FlatGroup& g : flat_.groups) {
    for (const ShardSlot& s : g.slots) {
      try {
        s.param->value = Tensor(s.param->value);  // an owning copy replaces the view
      } catch (...) {
        s.param->release_value();  // no memory for a copy: released, never dangling
      }
    }
  }
}

void ZeroRedundancyOptimizer::refresh_grads() {
  // Once per backward: clip_grad_norm scaled what this copied, and a step skipped after
  // it must not leave those copies for the next backward's step.
  if (refreshed_for_ == ddp_.backwards()) return;
  refreshed_for_ = ddp_.backwards();
  for (size_t i = 0; i < flat_.groups.size(); ++i) {
    Parameter& shard = *flat_.shards[i];
    if (options_.reduce_scatter) {
      shard.grad = ddp_.shard_grads(i);  // a view of DDP's reduced shard
      continue;
    }
    // This rank's block of the all-reduced bucket; the part past the bucket's end (the
    // padding of the last rank) stays zero.
    const size_t lo = static_cast<size_t>(ddp_.process_group().rank()) * shard.numel();
    Tensor bucket = ddp_.bucket_grads(i);
    const size_t n = lo < bucket.size() ? std::min(shard.numel(), bucket.size() - lo) : 0;
    if (n == 0) continue;
    Tensor::view(shard.grad.data(), 1, n, shard.device()).copy_from(Tensor::view(bucket.data() + lo, 1, n, bucket.device()));
  }
}

void ZeroRedundancyOptimizer::step() {
  ShardedOptimizer::step();
  ProcessGroup& pg = ddp_.process_group();
  if (pg.size() == 1) return;
  std::vector<Work> works;
  for (size_t i = 0; i < flat_.groups.size(); ++i) {
    Tensor& values = flat_.values[i];
    const size_t shard = flat_.groups[i].shard();
    works.push_back(pg.all_gather(buffer_of(values.data() + static_cast<size_t>(pg.rank()) * shard, shard, values.device()),
                                  buffer_of(values.data(), values.size(), values.device()), {.async_op = true}));
  }
  wait_all(works);
}

MemoryStats ZeroRedundancyOptimizer::memory() const {
  MemoryStats m = ddp_.memory();
  m.params = 0;
  for (const Tensor& v : flat_.values) m.params += v.size() * sizeof(float);
  m.optimizer = state_bytes();
  if (!options_.reduce_scatter) {
    for (const auto& s : flat_.shards) m.comm += s->numel() * sizeof(float);  // the copied slices
  }
  return m;
}

}  // namespace ddp
