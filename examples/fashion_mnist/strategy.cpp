// fashion_mnist's three strategies (see strategy.hpp): DDP, ZeRO-1 over DDP's buckets,
// and FSDP. Each one saves the same full checkpoint: sharded state is first gathered to
// rank 0 (consolidate_state, summon_full_params), which writes it as DDP would.
#include "strategy.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <utility>

#include "ddp/distributed_data_parallel.hpp"
#include "ddp/fully_sharded_data_parallel.hpp"
#include "ddp/types.hpp"
#include "ddp/zero_redundancy_optimizer.hpp"

namespace fashion_mnist {

// FNV-1a of every parameter's bytes: equal on every rank when they are identical.
uint64_t hash_parameters(ddp::Module& m) {
  uint64_t h = 1469598103934665603ull;
  for (auto* p : m.parameters()) {
    const ddp::Tensor host = p->value.to(ddp::Device::Cpu);
    const auto* b = reinterpret_cast<const unsigned char*>(host.data());
    for (size_t i = 0; i < host.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

void write_parameters(ddp::Module& m, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (auto* p : m.parameters()) {
    const ddp::Tensor host = p->value.to(ddp::Device::Cpu);
    f.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(host.size() * sizeof(float)));
  }
  if (!f) throw ddp::Error("cannot write " + path);
}

namespace {

// The full checkpoint, written by rank 0 of the strategy's group.
void save_full(Strategy& s, const std::string& path, const ddp::CheckpointInfo& info) {
  s.with_full_state([&](ddp::Module& m, const ddp::Optimizer& opt, bool root) {
    if (root) ddp::save_checkpoint(path, m, &opt, info);
  });
}

double squares(const float* g, size_t n) {
  double sq = 0;
  for (size_t i = 0; i < n; ++i) sq += static_cast<double>(g[i]) * g[i];
  return sq;
}

// A sharded optimizer's part of the squared norm: this rank's slice of each group, the
// elements of counted parameters only (padding is zero).
double shard_squares(const ddp::ShardedOptimizer& opt, int rank,
                     const std::function<bool(const ddp::Parameter&)>& counted) {
  double sq = 0;
  for (size_t g = 0; g < opt.groups().size(); ++g) {
    const ddp::FlatGroup& group = opt.groups()[g];
    const float* grad = opt.params()[g]->grad.data();
    const size_t lo = static_cast<size_t>(rank) * group.shard(), hi = lo + group.shard();
    for (const ddp::ShardSlot& s : group.slots) {
      const size_t b = std::max(lo, s.offset), e = std::min(hi, s.offset + s.param->numel());
      if (b < e && counted(*s.param)) sq += squares(grad + (b - lo), e - b);
    }
  }
  return sq;
}

void scale_shards(ddp::ShardedOptimizer& opt, float factor) {
  for (ddp::Parameter* p : opt.params()) p->grad.scale(factor);
}

ddp::DdpOptions ddp_options(const StrategyOptions& o, ddp::GradReduce reduce) {
  ddp::DdpOptions d;
  d.first_bucket_bytes = o.first_bucket_bytes;
  d.bucket_cap_bytes = o.bucket_cap_bytes;
  d.all_reduce = o.all_reduce;
  d.grad_dtype = o.grad_dtype;
  d.reduce = reduce;
  d.trace = o.trace;
  return d;
}

// DDP: full values, grads and optimizer state on every rank. Also the base of ZeRO-1,
// which keeps DDP's forward and backward (buckets reduce-scattered) and replaces the
// optimizer with one that steps this rank's shard of every bucket.
class DdpStrategy : public Strategy {
 public:
  DdpStrategy(const StrategyOptions& o, ddp::Sequential& model, std::shared_ptr<ddp::ProcessGroup> pg,
              ddp::GradReduce reduce)
      : ddp_(model, std::move(pg), ddp_options(o, reduce)) {}
  DdpStrategy(const StrategyOptions& o, ddp::Sequential& model, std::shared_ptr<ddp::ProcessGroup> pg,
              const ddp::OptimizerFactory& make)
      : DdpStrategy(o, model, std::move(pg), ddp::GradReduce::AllReduce) {
    own_ = make(model.parameters());
    opt_ = own_.get();
  }

  const ddp::Tensor& forward(const ddp::Tensor& x) override { return ddp_.forward(x); }
  const ddp::Tensor& backward(const ddp::Tensor& dy, bool sync, bool need_dx) override {
    if (sync) return ddp_.backward(dy, need_dx);
    auto guard = ddp_.no_sync();
    return ddp_.backward(dy, need_dx);
  }
  CommStats last_comm() const override {
    const ddp::BackwardStats& s = ddp_.last_backward();
    return {s.comm_wait, s.comm_busy, s.hidden()};
  }
  ddp::Optimizer& optimizer() override { return *opt_; }
  void step() override {
    opt_->step();
    ddp_.zero_grad();
  }
  float clip_grad_norm(float max_norm) override { return ddp_.clip_grad_norm(max_norm); }
  // Every rank holds the same reduced gradients: rank 0 counts them.
  double grad_squares(const std::function<bool(const ddp::Parameter&)>& counted) override {
    if (ddp_.process_group().rank() != 0) return 0;
    double sq = 0;
    for (const ddp::Parameter* p : ddp_.parameters()) {
      if (counted(*p)) sq += squares(p->grad.data(), p->grad.size());
    }
    return sq;
  }
  void scale_grads(float factor) override {
    for (ddp::Parameter* p : ddp_.parameters()) p->grad.scale(factor);
  }
  void with_full_state(const FullStateUse& use) override {
    use(ddp_.module(), *opt_, ddp_.process_group().rank() == 0);
  }
  // ZeRO-1 too: every rank holds the full values (the step all-gathers them).
  void with_full_params(const FullParamsUse& use) override { use(ddp_.module(), ddp_.process_group().rank() == 0); }
  void save_checkpoint(const std::string& path, const ddp::CheckpointInfo& info) override { save_full(*this, path, info); }
  uint64_t params_hash() override { return hash_parameters(ddp_.module()); }
  void write_params(const std::string& path) override {
    if (ddp_.process_group().rank() == 0) write_parameters(ddp_.module(), path);
  }
  ddp::MemoryStats memory() const override {
    ddp::MemoryStats m = ddp_.memory();
    m.optimizer = opt_->state_bytes();
    return m;
  }

 protected:
  ddp::DistributedDataParallel ddp_;
  ddp::Optimizer* opt_ = nullptr;
  std::unique_ptr<ddp::Optimizer> own_;  // DDP's optimizer (ZeRO-1 holds its own)
};

class Zero1Strategy : public DdpStrategy {
 public:
  Zero1Strategy(const StrategyOptions& o, ddp::Sequential& model, std::shared_ptr<ddp::ProcessGroup> pg,
                const ddp::OptimizerFactory& make)
      : DdpStrategy(o, model, std::move(pg), ddp::GradReduce::ReduceScatter),
        zero_(ddp_, make, ddp::ZeroOptions{.reduce_scatter = true}) {
    opt_ = &zero_;
  }
  float clip_grad_norm(float max_norm) override { return zero_.clip_grad_norm(max_norm); }
  double grad_squares(const std::function<bool(const ddp::Parameter&)>& counted) override {
    // The shards take this backward's reduced gradients when the optimizer refreshes
    // them (once per backward); a clip that cannot clip does that.
    zero_.clip_grad_norm(std::numeric_limits<float>::infinity());
    return shard_squares(zero_, ddp_.process_group().rank(), counted);
  }
  void scale_grads(float factor) override { scale_shards(zero_, factor); }
  void with_full_state(const FullStateUse& use) override {
    zero_.consolidate_state(0);
    DdpStrategy::with_full_state(use);
  }
  ddp::MemoryStats memory() const override {
    ddp::MemoryStats m = zero_.memory();
    m.optimizer = zero_.state_bytes();
    return m;
  }

 private:
  ddp::ZeroRedundancyOptimizer zero_;
};

class FsdpStrategy : public Strategy {
 public:
  FsdpStrategy(const StrategyOptions& o, ddp::Sequential& model, std::shared_ptr<ddp::ProcessGroup> pg,
               const ddp::OptimizerFactory& make)
      : rank_(pg->rank()),
        fsdp_(model, std::move(pg), ddp::FsdpOptions{.grad_dtype = o.grad_dtype, .trace = o.trace}),
        opt_(fsdp_.make_optimizer(make)) {}

  const ddp::Tensor& forward(const ddp::Tensor& x) override { return fsdp_.forward(x); }
  // Every micro-batch is reduce-scattered into the grad shards (they accumulate there).
  const ddp::Tensor& backward(const ddp::Tensor& dy, bool /*sync*/, bool need_dx) override {
    return fsdp_.backward(dy, need_dx);
  }
  CommStats last_comm() const override {
    const ddp::FsdpStepStats& s = fsdp_.last_step();
    return {s.comm_wait, s.comm_busy, s.hidden()};
  }
  ddp::Optimizer& optimizer() override { return *opt_; }
  void step() override {
    opt_->step();
    fsdp_.zero_grad();
  }
  float clip_grad_norm(float max_norm) override { return opt_->clip_grad_norm(max_norm); }
  double grad_squares(const std::function<bool(const ddp::Parameter&)>& counted) override {
    return shard_squares(*opt_, rank_, counted);
  }
  void scale_grads(float factor) override { scale_shards(*opt_, factor); }
  void with_full_state(const FullStateUse& use) override {
    auto full = fsdp_.summon_full_params(0);
    opt_->consolidate_state(0);
    use(fsdp_.module(), *opt_, rank_ == 0);
  }
  void with_full_params(const FullParamsUse& use) override {
    auto full = fsdp_.summon_full_params(0);
    use(fsdp_.module(), rank_ == 0);
  }
  void save_checkpoint(const std::string& path, const ddp::CheckpointInfo& info) override { save_full(*this, path, info); }
  uint64_t params_hash() override {
    auto full = fsdp_.summon_full_params(std::nullopt);
    return hash_parameters(fsdp_.module());
  }
  void write_params(const std::string& path) override {
    auto full = fsdp_.summon_full_params(0);
    if (rank_ == 0) write_parameters(fsdp_.module(), path);
  }
  ddp::MemoryStats memory() const override {
    ddp::MemoryStats m = fsdp_.memory();
    m.optimizer = opt_->state_bytes();
    return m;
  }

 private:
  int rank_;
  ddp::FullyShardedDataParallel fsdp_;
  std::unique_ptr<ddp::ShardedOptimizer> opt_;
};

}  // namespace

std::unique_ptr<Strategy> make_strategy(const StrategyOptions& options, ddp::Sequential& model,
                                        std::shared_ptr<ddp::ProcessGroup> pg, const ddp::OptimizerFactory& make) {
  if (options.kind == "ddp") return std::make_unique<DdpStrategy>(options, model, std::move(pg), make);
  if (options.kind != "zero1" && options.kind != "fsdp") {
    throw ddp::InvalidArgument("--strategy must be ddp, zero1 or fsdp, not '" + options.kind + "'");
  }
  for (const ddp::Parameter* p : model.parameters()) {
    if (p->value.is_cuda()) {
      throw ddp::InvalidArgument("--strategy " + options.kind + " shards host memory only for now: use --device cpu, "
                                 "or --strategy ddp on the GPU");
    }
  }
  if (!options.all_reduce) {
    throw ddp::InvalidArgument("--no-allreduce measures DDP only: it needs --strategy ddp");
  }
  if (options.kind == "zero1") return std::make_unique<Zero1Strategy>(options, model, std::move(pg), make);
  return std::make_unique<FsdpStrategy>(options, model, std::move(pg), make);
}

}  // namespace fashion_mnist
