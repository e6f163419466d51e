// The flat layout shared by ZeRO-1 and FSDP (bucket_groups) and ShardedOptimizer: an
// SGD/AdamW over one flat 1 × shard parameter per group, with the per-model-parameter
// state format assembled from (consolidate_state) and cut into (load_state) every
// rank's slices.
//
// Terms: a group's flat buffer holds its slots end to end, then zero padding up to
// `padded`; rank r owns the block [r * shard, (r + 1) * shard). A slot's elements that
// fall into that block are this rank's part of the slot.
#include "ddp/sharding.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <istream>
#include <ostream>
#include <string>

#include "ddp/types.hpp"
#include "device_ops.hpp"

namespace ddp {

std::vector<FlatGroup> bucket_groups(const std::vector<Parameter*>& params, size_t first_cap, size_t cap, int world) {
  if (world < 1) throw InvalidArgument("bucket_groups: world must be at least 1");
  std::vector<FlatGroup> groups;
  if (params.empty()) return groups;
  groups.emplace_back();
  size_t limit = first_cap;
  size_t bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    Parameter* p = params[k];
    const size_t b = p->numel() * sizeof(float);
    if (!groups.back().slots.empty() && bytes + b > limit) {
      groups.emplace_back();
      bytes = 0;
      limit = cap;
    }
    FlatGroup& g = groups.back();
    g.slots.push_back(ShardSlot{p, k, g.numel});
    g.numel += p->numel();
    bytes += b;
  }
  for (FlatGroup& g : groups) {
    g.world = world;
    g.padded = FlatGroup::padded_for(g.numel, world);
  }
  return groups;
}

namespace {

// The part of `slot` inside rank `rank`'s block of `g`: [begin, end) in the slot's own
// elements, and where that lands in the block. Empty (begin == end) when it misses.
struct Overlap {
  size_t begin = 0, end = 0;  // elements of the slot
  size_t at = 0;              // element of the block where `begin` lands
};

Overlap overlap(const FlatGroup& g, const ShardSlot& slot, int rank) {
  const size_t lo = static_cast<size_t>(rank) * g.shard(), hi = lo + g.shard();
  const size_t s_lo = slot.offset, s_hi = slot.offset + slot.param->numel();
  const size_t b = std::max(lo, s_lo), e = std::min(hi, s_hi);
  if (b >= e) return {};
  return {b - s_lo, e - s_lo, b - lo};
}

std::vector<std::pair<size_t, size_t>> slot_shapes(const std::vector<FlatGroup>& groups) {
  size_t count = 0;
  for (const FlatGroup& g : groups) count += g.slots.size();
  std::vector<std::pair<size_t, size_t>> shapes(count);
  std::vector<bool> seen(count, false);
  for (const FlatGroup& g : groups) {
    for (const ShardSlot& s : g.slots) {
      if (s.param == nullptr) throw InvalidArgument("ShardedOptimizer: a slot has no parameter");
      if (s.index >= count || seen[s.index]) {
        throw InvalidArgument("ShardedOptimizer: slot indices must number the parameters 0.." +
                              std::to_string(count - 1) + " once each ('" + s.param->name + "' has " +
                              std::to_string(s.index) + ")");
      }
      seen[s.index] = true;
      shapes[s.index] = {s.param->rows(), s.param->cols()};
    }
  }
  return shapes;
}

void check_groups(const std::vector<FlatGroup>& groups, const std::vector<Parameter*>& shards, int world) {
  if (groups.size() != shards.size()) {
    throw InvalidArgument("ShardedOptimizer: " + std::to_string(groups.size()) + " groups but " +
                          std::to_string(shards.size()) + " shard parameters");
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const FlatGroup& g = groups[i];
    const std::string which = "ShardedOptimizer: group " + std::to_string(i);
    if (g.world != world) {
      throw InvalidArgument(which + " is laid out for world " + std::to_string(g.world) + ", the group has " +
                            std::to_string(world) + " ranks");
    }
    if (g.padded % static_cast<size_t>(world) != 0 || g.padded < g.numel) {
      throw InvalidArgument(which + ": padded " + std::to_string(g.padded) + " is not numel " +
                            std::to_string(g.numel) + " rounded up to a multiple of the world");
    }
    size_t end = 0;
    for (const ShardSlot& s : g.slots) {
      if (s.offset < end) throw InvalidArgument(which + ": slots overlap or are out of order");
      end = s.offset + s.param->numel();
    }
    if (end > g.numel) throw InvalidArgument(which + ": slots run past numel");
    const Parameter* p = shards[i];
    if (p == nullptr || p->rows() != 1 || p->cols() != g.shard()) {
      throw InvalidArgument(which + ": its shard parameter must be 1 x " + std::to_string(g.shard()));
    }
  }
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(std::vector<FlatGroup> groups, std::vector<Parameter*> shards,
                                   std::shared_ptr<ProcessGroup> pg, const OptimizerFactory& make)
    : Optimizer(shards, 0.0f), groups_(std::move(groups)), pg_(std::move(pg)) {
  if (!pg_) throw InvalidArgument("ShardedOptimizer: no process group");
  if (!make) throw InvalidArgument("ShardedOptimizer: no optimizer factory");
  check_groups(groups_, params_, pg_->size());
  shapes_ = slot_shapes(groups_);
  local_ = make(params_);
  if (!local_) throw InvalidArgument("ShardedOptimizer: the factory returned no optimizer");
  if (local_->params() != params_) {
    throw InvalidArgument("ShardedOptimizer: the factory's optimizer must step exactly the shards it was given");
  }
  lr_ = local_->lr();
  steps_ = local_->steps();
}

void ShardedOptimizer::step() {
  refresh_grads();
  local_->set_lr(lr_);
  local_->step();
  steps_ = local_->steps();
  consolidated_.reset();
}

const char* ShardedOptimizer::kind() const { return local_->kind(); }

OptimizerState ShardedOptimizer::state() const { return local_->state(); }

void ShardedOptimizer::set_state(const OptimizerState& state) {
  local_->set_state(state);
  steps_ = local_->steps();
  consolidated_.reset();
}

void ShardedOptimizer::consolidate_state(int root) {
  if (root < 0 || root >= pg_->size()) {
    throw InvalidArgument("ShardedOptimizer::consolidate_state: root " + std::to_string(root) + " is not a rank of " +
                          std::to_string(pg_->size()));
  }
  consolidated_root_ = root;
  const OptimizerState local = local_->state();
  const bool on_root = pg_->rank() == root;
  auto full = std::make_unique<OptimizerState>();
  full->kind = local.kind;
  full->steps = local.steps;
  full->buffers.assign(local.buffers.size(), std::vector<Tensor>(shapes_.size()));
  // Gather every (buffer, group) as a padded flat buffer on root: 1 × shard blocks in
  // rank order. A buffer that does not exist yet (SGD's momentum before its first step)
  // is absent on every rank alike (they all took the same steps), so it is skipped.
  std::vector<Tensor> host(local.buffers.size() * groups_.size());
  std::vector<Tensor> flat(host.size());
  std::vector<Work> works;
  for (size_t k = 0; k < local.buffers.size(); ++k) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      const Tensor& mine = local.buffers[k][g];
      if (mine.empty()) continue;
      const size_t at = k * groups_.size() + g;
      host[at] = mine.to(Device::Cpu);  // gathered on the host, whatever the shards' device
      if (on_root) flat[at] = Tensor(1, groups_[g].padded);
      works.push_back(pg_->gather(Buffer{host[at].data(), host[at].size(), DType::F32, Device::Cpu},
                                  Buffer{flat[at].data(), flat[at].size(), DType::F32, Device::Cpu}, root,
                                  {.async_op = true}));
    }
  }
  wait_all(works);  // on a throw, nothing still writes the locals above
  if (!on_root) {
    consolidated_.reset();
    return;
  }
  // Cut the flat buffers into the model's parameters, by their slots.
  for (size_t k = 0; k < local.buffers.size(); ++k) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      const Tensor& src = flat[k * groups_.size() + g];
      if (src.empty()) continue;
      for (const ShardSlot& s : groups_[g].slots) {
        Tensor t(s.param->rows(), s.param->cols());
        std::memcpy(t.data(), src.data() + s.offset, s.param->numel() * sizeof(float));
        full->buffers[k][s.index] = std::move(t);
      }
    }
  }
  consolidated_ = std::move(full);
}

void ShardedOptimizer::save_state(std::ostream& out) const {
  if (!consolidated_) {
    throw InvalidArgument(pg_->rank() == consolidated_root_
                              ? "ShardedOptimizer::save_state: call consolidate_state() after the last step first"
                              : "ShardedOptimizer::save_state: only the root of consolidate_state() holds the whole "
                                "state (rank " + std::to_string(pg_->rank()) + " does not)");
  }
  write_optimizer_state(out, *consolidated_);
}

void ShardedOptimizer::load_state(std::istream& in) {
  const OptimizerState full = read_optimizer_state(in, kind(), shapes_);
  OptimizerState mine{full.kind, full.steps, std::vector<std::vector<Tensor>>(full.buffers.size())};
  for (size_t k = 0; k < full.buffers.size(); ++k) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      const FlatGroup& group = groups_[g];
      // A group's buffer exists when its parameters' do; all of them or none (a
      // shard cannot hold half a momentum buffer).
      size_t present = 0;
      for (const ShardSlot& s : group.slots) present += full.buffers[k][s.index].empty() ? 0 : 1;
      if (present == 0) {
        mine.buffers[k].emplace_back();
        continue;
      }
      if (present != group.slots.size()) {
        throw Error("ShardedOptimizer::load_state: some parameters of group " + std::to_string(g) +
                    " have a state buffer and some do not");
      }
      Tensor shard(1, group.shard());  // zero: padding stays zero
      for (const ShardSlot& s : group.slots) {
        const Overlap o = overlap(group, s, pg_->rank());
        if (o.begin == o.end) continue;
        std::memcpy(shard.data() + o.at, full.buffers[k][s.index].data() + o.begin, (o.end - o.begin) * sizeof(float));
      }
      const Device device = params_[g]->device();
      mine.buffers[k].push_back(device == Device::Cpu ? std::move(shard) : shard.to(device));
    }
  }
  set_state(mine);
}

float ShardedOptimizer::clip_grad_norm(float max_norm) {
  if (!(max_norm >= 0.0f)) throw InvalidArgument("ShardedOptimizer::clip_grad_norm: max_norm " + std::to_string(max_norm));
  refresh_grads();
  double sq = 0;  // padding is zero, so it adds nothing
  for (const Parameter* p : params_) {
    if (p->grad.is_cuda()) {
      sq += detail::device::sum_squares(p->grad.data(), p->grad.size());
    } else {
      for (float g : p->grad.span()) sq += static_cast<double>(g) * g;
    }
  }
  pg_->all_reduce(Buffer{&sq, 1, DType::F64, Device::Cpu}, ReduceOp::Sum);
  const float norm = static_cast<float>(std::sqrt(sq));
  if (norm > max_norm && norm > 0) {
    const float scale = max_norm / (norm + 1e-6f);  // as DistributedDataParallel::clip_grad_norm
    for (Parameter* p : params_) p->grad.scale(scale);
  }
  return norm;
}

}  // namespace ddp
