// FullyShardedDataParallel: units, construction, forward and backward (see
// fully_sharded_data_parallel.hpp for the contract and fsdp_impl.hpp for the terms).
//
// Collectives all go to one group, so they run one at a time in issue order; every rank
// issues the same sequence (the schedule below depends only on the unit count and the
// options). Forward, unit u: issue the gathers of u..u+prefetch not yet issued, wait for
// u's, run it, release it (but for the last 1 + prefetch units, which backward needs first). Backward, unit u from the last: issue the gathers of
// u..u-prefetch, wait for u's, bind the unit's grads into a zeroed grad pool buffer, run the
// unit's backward, issue its reduce-scatter (async), release its values. A grad buffer is
// reused only after the reduce-scatter that read it completed; a value buffer only after
// the unit that used it ran.
#include "ddp/fully_sharded_data_parallel.hpp"

#include <cstring>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include "ddp/bf16.hpp"
#include "ddp/trace.hpp"
#include "fsdp_impl.hpp"

namespace ddp {

namespace {
double seconds(FsdpClock::duration d) { return std::chrono::duration<double>(d).count(); }

Buffer f32(float* data, size_t count) { return Buffer{data, count, DType::F32, Device::Cpu}; }
}  // namespace

// ---------------------------------------------------------------------------
// Units and construction
// ---------------------------------------------------------------------------

void FullyShardedDataParallel::Impl::build_units() {
  const auto all = model.parameters();
  size_t index = 0;         // position in model.parameters() of the next parameter
  size_t layers = 0;        // parameterised children in the current unit
  FsdpUnit* unit = nullptr;  // the unit being filled
  for (size_t i = 0; i < model.size(); ++i) {
    Module& m = model[i];
    const auto params = m.parameters();
    // A parameterised child opens a unit once the current one is full; parameter-free
    // children (ReLU) join the unit before them (leading ones, the first unit).
    if (unit == nullptr || (!params.empty() && layers == options.layers_per_unit)) {
      units.push_back(std::make_unique<FsdpUnit>());
      unit = units.back().get();
      unit->first_module = i;
      layers = 0;
    }
    unit->modules.push_back(&m);
    if (!params.empty()) ++layers;
    for (Parameter* p : params) {
      if (p->device() != Device::Cpu) {
        throw InvalidArgument("FullyShardedDataParallel: '" + p->name + "' is on " + device_name(p->device()) +
                              " (host parameters only)");
      }
      if (!p->materialized()) {
        throw InvalidArgument("FullyShardedDataParallel: '" + p->name + "' is released (already sharded?)");
      }
      if (index >= all.size() || all[index] != p) {
        throw InvalidArgument("FullyShardedDataParallel: the model's parameters() are not its children's in order");
      }
      unit->group.slots.push_back(ShardSlot{p, index++, unit->group.numel});
      unit->group.numel += p->numel();
    }
  }
  for (size_t u = 0; u < units.size(); ++u) {
    FlatGroup& g = units[u]->group;
    g.world = pg->size();
    g.padded = FlatGroup::padded_for(g.numel, g.world);
    max_padded = std::max(max_padded, g.padded);
    units[u]->shard = std::make_unique<Parameter>("fsdp.unit" + std::to_string(u), 1, g.shard());
  }
}

// Every unit: rank 0's values (broadcast) packed into a padded flat buffer, this rank's
// slice kept in the shard, the full values and grads freed. One unit at a time, so the
// extra memory is one unit's.
void FullyShardedDataParallel::Impl::shard_values() {
  Tensor flat(1, max_padded);
  for (auto& unit : units) {
    const FlatGroup& g = unit->group;
    flat.zero();
    for (const ShardSlot& s : g.slots) std::memcpy(flat.data() + s.offset, s.param->value.data(), s.param->numel() * 4);
    if (options.broadcast_parameters && pg->size() > 1) pg->broadcast(f32(flat.data(), g.padded), 0);
    std::memcpy(unit->shard->value.data(), flat.data() + g.shard() * static_cast<size_t>(pg->rank()), g.shard() * 4);
    for (const ShardSlot& s : g.slots) {
      s.param->release_value();
      s.param->grad = Tensor();  // backward binds it into the grad pool
    }
  }
}

FullyShardedDataParallel::FullyShardedDataParallel(Sequential& model, std::shared_ptr<ProcessGroup> pg,
                                                   const FsdpOptions& options)
    : impl_(std::make_unique<Impl>(model, std::move(pg), options)) {
  Impl& s = *impl_;
  if (!s.pg) throw InvalidArgument("FullyShardedDataParallel: no process group");
  if (options.layers_per_unit == 0) throw InvalidArgument("FullyShardedDataParallel: layers_per_unit must be at least 1");
  if (options.prefetch < 0) {
    throw InvalidArgument("FullyShardedDataParallel: prefetch " + std::to_string(options.prefetch) + " is negative");
  }
  if (options.grad_dtype != DType::F32 && options.grad_dtype != DType::BF16) {
    throw InvalidArgument(std::string("FullyShardedDataParallel: grad_dtype ") + dtype_name(options.grad_dtype) +
                          " (f32 or bf16)");
  }
  if (model.parameters().empty()) throw InvalidArgument("FullyShardedDataParallel: the model has no parameters");
  s.build_units();
  s.shard_values();
#if defined(__GLIBC__)
  // The full values and grads just freed (4 bytes × 2 per parameter) mostly lie in the
  // middle of the heap, where free() keeps them: without this, the memory sharding
  // saves stays resident (about 80 MB for the wide MLP).
  malloc_trim(0);
#endif
  const size_t n_units = s.units.size();
  // Both pools are group memory: on one host the backend's gathers and reduce-scatters
  // then read the peers' buffers in place (no copies through a channel).
  const auto group_buffer = [&s](std::vector<std::unique_ptr<GroupMemory>>& memory, size_t n) {
    memory.push_back(s.pg->allocate(n * sizeof(float)));
    return Tensor::view(reinterpret_cast<float*>(memory.back()->data()), 1, n);
  };
  if (options.reshard_after_forward) {
    const size_t pool = std::min(n_units, static_cast<size_t>(options.prefetch) + 1);
    for (size_t i = 0; i < pool; ++i) s.values.push_back(group_buffer(s.value_memory, s.max_padded));
  } else {
    for (auto& unit : s.units) s.values.push_back(group_buffer(s.value_memory, unit->group.padded));
  }
  s.value_owner.assign(s.values.size(), -1);
  const size_t grad_pool = std::min<size_t>(n_units, 2);
  for (size_t i = 0; i < grad_pool; ++i) s.grads.push_back(group_buffer(s.grad_memory, s.max_padded));
  s.grad_owner.assign(grad_pool, -1);
  s.rs_temp.resize(grad_pool);
  s.staging.resize(grad_pool);
  if (s.rounds_grads()) {
    // Group memory: the widening reduce-scatter reads the peers' staging in place.
    for (auto& st : s.staging) st = s.pg->allocate(s.max_padded * sizeof(BFloat16));
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  // No collective may still write into buffers that are about to go away.
  if (impl_) impl_->settle();
}

// ---------------------------------------------------------------------------
// Pools and collectives
// ---------------------------------------------------------------------------

void FullyShardedDataParallel::Impl::need_not_summoned(const char* call) const {
  if (summoned) throw InvalidArgument(std::string("FullyShardedDataParallel::") + call + " inside summon_full_params");
}

void FullyShardedDataParallel::Impl::issue_gather(size_t u) {
  FsdpUnit& unit = *units[u];
  if (unit.value_slot >= 0) return;
  int slot = -1;
  if (!options.reshard_after_forward) {
    slot = static_cast<int>(u);  // its own buffer
  } else {
    for (size_t i = 0; i < value_owner.size() && slot < 0; ++i)
      if (value_owner[i] < 0) slot = static_cast<int>(i);
  }
  if (slot < 0 || value_owner[static_cast<size_t>(slot)] >= 0) {
    throw Error("FullyShardedDataParallel: no free value buffer for unit " + std::to_string(u) + " (a schedule bug)");
  }
  value_owner[static_cast<size_t>(slot)] = static_cast<int>(u);
  unit.value_slot = slot;
  transient_now += values[static_cast<size_t>(slot)].size() * sizeof(float);
  transient_peak = std::max(transient_peak, transient_now);
  unit.gather_issued = FsdpClock::now();
  unit.gather = pg->all_gather(f32(unit.shard->value.data(), unit.group.shard()),
                               f32(values[static_cast<size_t>(slot)].data(), unit.group.padded), {.async_op = true});
}

void FullyShardedDataParallel::Impl::waited(const Work& w, FsdpClock::time_point wait_start,
                                            FsdpClock::time_point issued, const char* what, size_t u, bool from_issue) {
  const auto now = FsdpClock::now();
  stats.comm_wait += seconds(now - wait_start);
  const auto t = w.timing();
  if (t.known) stats.comm_busy += seconds(t.end - t.start);
  // A gather from its issue (prefetching is about issuing early), a reduce-scatter from
  // when it started running (overlap is about running beside compute): the clock stamps
  // the overlap checks read.
  if (options.trace) {
    const auto begin = from_issue || !t.known ? issued : t.start;
    options.trace->add(std::string(phase) + " " + what + " unit " + std::to_string(u), begin, t.known ? t.end : now,
                       Trace::kCommunication);
  }
}

void FullyShardedDataParallel::Impl::wait_gather(size_t u) {
  FsdpUnit& unit = *units[u];
  if (unit.bound) return;
  issue_gather(u);
  const auto t0 = FsdpClock::now();
  unit.gather.wait();
  waited(unit.gather, t0, unit.gather_issued, "all_gather", u, true);
  unit.gather = Work();
  float* base = values[static_cast<size_t>(unit.value_slot)].data();
  for (const ShardSlot& s : unit.group.slots) s.param->bind_value(base + s.offset, false);
  unit.bound = true;
}

void FullyShardedDataParallel::Impl::release(size_t u) {
  FsdpUnit& unit = *units[u];
  if (unit.value_slot < 0) return;
  for (const ShardSlot& s : unit.group.slots) s.param->release_value();
  transient_now -= values[static_cast<size_t>(unit.value_slot)].size() * sizeof(float);
  value_owner[static_cast<size_t>(unit.value_slot)] = -1;
  unit.value_slot = -1;
  unit.bound = false;
}

int FullyShardedDataParallel::Impl::acquire_grad_slot(size_t u) {
  // The two buffers alternate: the unit before (in backward order) holds the other one.
  const size_t slot = (units.size() - 1 - u) % grads.size();
  if (grad_owner[slot] >= 0) finish_reduce_scatter(static_cast<size_t>(grad_owner[slot]));
  grad_owner[slot] = static_cast<int>(u);
  units[u]->grad_slot = static_cast<int>(slot);
  transient_now += grads[slot].size() * sizeof(float);
  transient_peak = std::max(transient_peak, transient_now);
  return static_cast<int>(slot);
}

void FullyShardedDataParallel::Impl::issue_reduce_scatter(size_t u) {
  FsdpUnit& unit = *units[u];
  const auto slot = static_cast<size_t>(unit.grad_slot);
  const size_t shard = unit.group.shard();
  // Straight into the grad shard when it holds nothing; otherwise (accumulation over
  // several backwards) into a temp that finish_reduce_scatter adds in.
  unit.rs_into_temp = !unit.grad_zero;
  float* out = unit.shard->grad.data();
  if (unit.rs_into_temp) {
    if (rs_temp[slot].size() < max_padded / static_cast<size_t>(pg->size())) {
      rs_temp[slot] = Tensor(1, max_padded / static_cast<size_t>(pg->size()));
    }
    out = rs_temp[slot].data();
  }
  Buffer input = f32(grads[slot].data(), unit.group.padded);
  if (rounds_grads()) {
    // The one rounding of the gradients: f32 accumulation before, f32 reduction after.
    auto* wire = reinterpret_cast<BFloat16*>(staging[slot]->data());
    round_to_bf16(grads[slot].data(), wire, unit.group.padded);
    input = Buffer{wire, unit.group.padded, DType::BF16, Device::Cpu};
  }
  unit.rs_issued = FsdpClock::now();
  unit.rs = pg->reduce_scatter(input, f32(out, shard), ReduceOp::Avg, {.async_op = true});
  unit.grad_zero = false;
}

void FullyShardedDataParallel::Impl::finish_reduce_scatter(size_t u) {
  FsdpUnit& unit = *units[u];
  if (unit.grad_slot < 0) return;
  const auto slot = static_cast<size_t>(unit.grad_slot);
  const auto t0 = FsdpClock::now();
  unit.rs.wait();
  waited(unit.rs, t0, unit.rs_issued, "reduce_scatter", u, false);
  unit.rs = Work();
  const size_t shard = unit.group.shard();
  const float* reduced = unit.rs_into_temp ? rs_temp[slot].data() : nullptr;  // nullptr: already in the grad shard
  if (reduced != nullptr && unit.grad_zero) {
    std::memcpy(unit.shard->grad.data(), reduced, shard * sizeof(float));
  } else if (reduced != nullptr) {
    float* __restrict g = unit.shard->grad.data();
    const float* __restrict t = reduced;
    for (size_t i = 0; i < shard; ++i) g[i] += t[i];
  }
  unit.grad_zero = false;
  transient_now -= grads[slot].size() * sizeof(float);
  grad_owner[slot] = -1;
  unit.grad_slot = -1;
}

void FullyShardedDataParallel::Impl::settle() noexcept {
  for (size_t u = 0; u < units.size(); ++u) {
    FsdpUnit& unit = *units[u];
    wait_all_noexcept({&unit.gather, &unit.rs});
    unit.gather = Work();
    unit.rs = Work();
    if (unit.grad_slot >= 0) {
      transient_now -= grads[static_cast<size_t>(unit.grad_slot)].size() * sizeof(float);
      grad_owner[static_cast<size_t>(unit.grad_slot)] = -1;
      unit.grad_slot = -1;
    }
    for (const ShardSlot& s : unit.group.slots) s.param->grad = Tensor();
    release(u);
  }
}

// ---------------------------------------------------------------------------
// Forward and backward
// ---------------------------------------------------------------------------

const Tensor& FullyShardedDataParallel::forward(const Tensor& x) {
  Impl& s = *impl_;
  s.need_not_summoned("forward");
  s.settle();  // after a forward without backward (evaluation), or one that threw
  s.stats = FsdpStepStats{};
  const size_t slot = s.model.slot();
  s.mark_forwarded(slot, false);
  s.phase = "forward";
  const size_t n = s.units.size();
  const size_t ahead = static_cast<size_t>(s.options.prefetch);
  const Tensor* h = &x;
  try {
    for (size_t u = 0; u < n; ++u) {
      for (size_t k = 0; k <= ahead && u + k < n; ++k) s.issue_gather(u + k);
      s.wait_gather(u);
      auto scope = Trace::scope(s.options.trace, "forward unit " + std::to_string(u));
      const auto t0 = FsdpClock::now();
      for (Module* m : s.units[u]->modules) h = &m->forward(*h);
      s.stats.forward += seconds(FsdpClock::now() - t0);
      // The last 1 + prefetch units stay gathered: backward starts with them (its prefetch
      // would gather them again at once, with no compute to hide behind), and the pool has
      // room for exactly them.
      if (s.options.reshard_after_forward && u + 1 + ahead < n) s.release(u);
    }
  } catch (...) {
    s.settle();
    throw;
  }
  s.mark_forwarded(slot, true);
  return *h;
}

void FullyShardedDataParallel::backward(const Tensor& dy) { backward(dy, false); }

const Tensor& FullyShardedDataParallel::backward(const Tensor& dy, bool need_dx) {
  Impl& s = *impl_;
  s.need_not_summoned("backward");
  const size_t slot = s.model.slot();
  if (!s.forwarded(slot)) {
    throw InvalidArgument("FullyShardedDataParallel::backward without a forward before it (activation slot " +
                          std::to_string(slot) + ")");
  }
  s.mark_forwarded(slot, false);
  s.phase = "backward";
  const size_t n = s.units.size();
  const size_t ahead = static_cast<size_t>(s.options.prefetch);
  const Tensor* g = &dy;
  try {
    for (size_t u = n; u-- > 0;) {
      for (size_t k = 0; k <= ahead && k <= u; ++k) s.issue_gather(u - k);
      s.wait_gather(u);
      FsdpUnit& unit = *s.units[u];
      const auto slot = static_cast<size_t>(s.acquire_grad_slot(u));
      std::memset(s.grads[slot].data(), 0, unit.group.padded * sizeof(float));  // padding included
      // Views straight into the zeroed buffer (bind_grad would zero each slot again).
      for (const ShardSlot& p : unit.group.slots) {
        p.param->grad = Tensor::view(s.grads[slot].data() + p.offset, p.param->rows(), p.param->cols());
      }
      {
        auto scope = Trace::scope(s.options.trace, "backward unit " + std::to_string(u));
        const auto t0 = FsdpClock::now();
        for (size_t i = unit.modules.size(); i-- > 0;) {
          // The model's first module computes no input gradient unless asked (as
          // Sequential::backward).
          g = &unit.modules[i]->backward(*g, GradReadyHook{}, need_dx || unit.first_module + i > 0);
        }
        s.stats.backward += seconds(FsdpClock::now() - t0);
      }
      for (const ShardSlot& p : unit.group.slots) p.param->grad = Tensor();
      s.issue_reduce_scatter(u);
      s.release(u);
    }
    for (size_t u = 0; u < n; ++u) s.finish_reduce_scatter(u);
  } catch (...) {
    s.settle();
    throw;
  }
  static const Tensor kNoInputGrad;
  return need_dx ? *g : kNoInputGrad;
}

void FullyShardedDataParallel::zero_grad() {
  Impl& s = *impl_;
  for (auto& unit : s.units) {
    unit->shard->grad.zero();
    unit->grad_zero = true;
  }
}

size_t FullyShardedDataParallel::num_units() const { return impl_->units.size(); }
Sequential& FullyShardedDataParallel::module() { return impl_->model; }
const FsdpStepStats& FullyShardedDataParallel::last_step() const { return impl_->stats; }

}  // namespace ddp
