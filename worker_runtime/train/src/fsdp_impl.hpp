// FullyShardedDataParallel's state, shared by its source files (fully_sharded_data_parallel.cpp:
// units, forward and backward; fsdp_full_params.cpp: summon_full_params, memory, optimizer).
//
// Terms. A unit is a run of the Sequential's children with `layers_per_unit` parameterised
// ones; its parameters form one FlatGroup (registration order, zero-padded to a multiple of
// the world). Persistent per unit: `shard`, a 1 × group.shard() Parameter whose value is this
// rank's slice of the unit's values and whose grad is its slice of the reduced gradients.
// Transient: the value pool (gathered units) and the grad pool (a unit's unsharded grads while
// its backward runs and its reduce-scatter reads them).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "ddp/fully_sharded_data_parallel.hpp"
#include "ddp/types.hpp"

namespace ddp {

using FsdpClock = std::chrono::steady_clock;

struct FsdpUnit {
  std::vector<Module*> modules;  // the children it runs, in order
  size_t first_module = 0;       // index of modules[0] in the Sequential
  FlatGroup group;
  std::unique_ptr<Parameter> shard;  // value: this rank's values; grad: its reduced grads

  int value_slot = -1;  // value pool buffer holding (or receiving) the gathered values; -1: none
  bool bound = false;   // the gather completed and the parameters are views into the slot
  Work gather;
  FsdpClock::time_point gather_issued;

  int grad_slot = -1;  // grad pool buffer its reduce-scatter still reads; -1: none
  bool rs_into_temp = false;  // the RS writes the slot's temp (then added into shard->grad)
  Work rs;
  FsdpClock::time_point rs_issued;
  bool grad_zero = true;  // shard->grad holds nothing since zero_grad (RS can write it directly)
};

struct FullyShardedDataParallel::Impl {
  Sequential& model;
  std::shared_ptr<ProcessGroup> pg;
  FsdpOptions options;
  std::vector<std::unique_ptr<FsdpUnit>> units;
  size_t max_padded = 0;  // the largest unit's padded element count

  // Value pool: with reshard_after_forward, min(1 + prefetch, units) buffers of max_padded
  // reused in turn; without it, one buffer per unit of its own size (all stay gathered from
  // forward to backward).
  std::vector<std::unique_ptr<GroupMemory>> value_memory;  // from pg->allocate
  std::vector<Tensor> values;                               // views of value_memory
  std::vector<int> value_owner;  // unit using each buffer, -1: free
  // Grad pool: min(2, units) buffers of max_padded; the RS outputs used while a unit's grad
  // shard already holds gradients (accumulation; allocated on first use), and bf16 staging.
  std::vector<std::unique_ptr<GroupMemory>> grad_memory;  // from pg->allocate
  std::vector<Tensor> grads;                               // views of grad_memory
  std::vector<int> grad_owner;
  std::vector<Tensor> rs_temp;
  std::vector<std::unique_ptr<GroupMemory>> staging;

  // Per activation slot (Module::select_slot): a forward whose backward has not run yet.
  std::vector<bool> forward_ran;
  bool forwarded(size_t slot) const { return slot < forward_ran.size() && forward_ran[slot]; }
  void mark_forwarded(size_t slot, bool ran) {
    if (slot >= forward_ran.size()) forward_ran.resize(slot + 1, false);
    forward_ran[slot] = ran;
  }
  bool summoned = false;     // inside summon_full_params
  std::vector<Tensor> full;  // summon_full_params' buffers, one per unit (padded)

  const char* phase = "forward";  // names the trace's events: "forward all_gather unit 2"
  FsdpStepStats stats;
  size_t transient_now = 0;
  size_t transient_peak = 0;

  Impl(Sequential& m, std::shared_ptr<ProcessGroup> g, const FsdpOptions& o) : model(m), pg(std::move(g)), options(o) {}

  // Units and construction (fully_sharded_data_parallel.cpp).
  void build_units();
  void shard_values();
  // Issues unit u's gather unless it is gathered or on its way.
  void issue_gather(size_t u);
  // Waits for unit u's gather and binds its parameters to the gathered values.
  void wait_gather(size_t u);
  // Unbinds unit u's parameters and gives its value buffer back.
  void release(size_t u);
  // A grad pool buffer for unit u (waiting for the reduce-scatter that still reads one).
  int acquire_grad_slot(size_t u);
  void issue_reduce_scatter(size_t u);
  // Waits for unit u's reduce-scatter, adds a temp output into its grad shard, frees the slot.
  void finish_reduce_scatter(size_t u);
  // Waits for every pending operation (errors swallowed) and releases every unit: the
  // state to start a forward, a backward or summon_full_params from.
  void settle() noexcept;
  // Adds a completed operation to the step's figures and, from its issue or from its real
  // start, to the trace.
  void waited(const Work& w, FsdpClock::time_point wait_start, FsdpClock::time_point issued, const char* what,
              size_t u, bool from_issue);
  // bf16 gradients are rounded only where they are reduced: at world 1 nothing is, so
  // FSDP trains as DDP and ZeRO-1 do there (in f32).
  bool rounds_grads() const { return options.grad_dtype == DType::BF16 && pg->size() > 1; }
  void need_not_summoned(const char* call) const;
};

}  // namespace ddp
