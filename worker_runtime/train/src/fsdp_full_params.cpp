// FullyShardedDataParallel outside the training step: summon_full_params (the full values
// bound to the model's parameters for checkpoints, hashes and evaluation by hand), the
// optimizer over the shards, and the memory accounting.
#include <string>

#include "ddp/fully_sharded_data_parallel.hpp"
#include "fsdp_impl.hpp"

namespace ddp {

FullyShardedDataParallel::FullParams FullyShardedDataParallel::summon_full_params(std::optional<int> root) {
  Impl& s = *impl_;
  s.need_not_summoned("summon_full_params");
  const int n = s.pg->size();
  if (root && (*root < 0 || *root >= n)) {
    throw InvalidArgument("FullyShardedDataParallel::summon_full_params: root " + std::to_string(*root) +
                          " is not a rank of the group (size " + std::to_string(n) + ")");
  }
  s.settle();  // a forward without backward leaves units gathered into the pool
  s.forward_ran.clear();
  const bool here = !root || *root == s.pg->rank();
  // Every unit's gather is issued first and waited for after: one pass of the group.
  std::vector<Work> works;
  s.full.clear();
  for (auto& unit : s.units) {
    const FlatGroup& g = unit->group;
    s.full.emplace_back(here ? Tensor(1, g.padded) : Tensor());
    const Buffer in{unit->shard->value.data(), g.shard(), DType::F32, Device::Cpu};
    const Buffer out{s.full.back().data(), here ? g.padded : 0, DType::F32, Device::Cpu};
    works.push_back(root ? s.pg->gather(in, out, *root, {.async_op = true})
                         : s.pg->all_gather(in, out, {.async_op = true}));
  }
  try {
    wait_all(works);
  } catch (...) {
    s.full.clear();  // nothing writes it any more
    throw;
  }
  if (here) {
    for (size_t u = 0; u < s.units.size(); ++u) {
      for (const ShardSlot& slot : s.units[u]->group.slots) slot.param->bind_value(s.full[u].data() + slot.offset, false);
    }
  }
  s.summoned = true;
  return FullParams(this);
}

FullyShardedDataParallel::FullParams::FullParams(FullyShardedDataParallel* owner) : owner_(owner) {}

FullyShardedDataParallel::FullParams::FullParams(FullParams&& other) noexcept : owner_(other.owner_) {
  other.owner_ = nullptr;
}

FullyShardedDataParallel::FullParams::~FullParams() {
  if (!owner_) return;
  Impl& s = *owner_->impl_;
  // Changes made to the values inside are not written back: the shards are the truth.
  for (auto& unit : s.units)
    for (const ShardSlot& slot : unit->group.slots) slot.param->release_value();
  s.full.clear();
  s.summoned = false;
}

std::unique_ptr<ShardedOptimizer> FullyShardedDataParallel::make_optimizer(const OptimizerFactory& make) {
  Impl& s = *impl_;
  std::vector<FlatGroup> groups;
  std::vector<Parameter*> shards;
  for (auto& unit : s.units) {
    groups.push_back(unit->group);
    shards.push_back(unit->shard.get());
  }
  return std::make_unique<ShardedOptimizer>(std::move(groups), std::move(shards), s.pg, make);
}

MemoryStats FullyShardedDataParallel::memory() const {
  const Impl& s = *impl_;
  MemoryStats m;
  for (const auto& unit : s.units) {
    m.params += unit->shard->value.size() * sizeof(float);
    m.grads += unit->shard->grad.size() * sizeof(float);
  }
  for (const Tensor& t : s.rs_temp) m.comm += t.size() * sizeof(float);
  for (const auto& st : s.staging) m.comm += st ? st->bytes() : 0;
  m.transient_peak = s.transient_peak;
  return m;
}

}  // namespace ddp
