// DistributedDataParallel (see the header): buckets, their reductions, and the
// timing of each backward.
//
// Gradients live in flat buckets: parameters are assigned in reverse registration
// order (backward produces them in that order), the first bucket up to
// first_bucket_bytes, the rest up to bucket_cap_bytes. Each parameter's grad is a
// view into its bucket, so backward writes straight into the buffer that is
// reduced. The moment the last gradient of a bucket is final (the model's
// grad-ready hook), that bucket's all-reduce (average) starts asynchronously and
// runs while backward continues with earlier layers (the last bucket, filled when
// backward has nothing left to do, runs on the calling thread). Buckets start in the
// same order on every rank; backward() returns once all of them are reduced, so every
// rank then holds bit-identical gradients. Host buckets come from
// ProcessGroup::allocate: memory the group's collectives reach without copying.
//
// On the GPU the buckets are device memory, which the group's NCCL member reduces.
// Kernels and cuBLAS run on the default stream and NCCL on its own stream, ordered
// after the work queued when the bucket was launched: a bucket's all-reduce runs on
// the GPU while the kernels of earlier layers still compute. backward()'s times are
// then host times of launching that work, and comm_wait includes the compute still
// queued when backward returned.
#include "ddp/distributed_data_parallel.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "ddp/bf16.hpp"
#include "ddp/progress.hpp"
#include "ddp/trace.hpp"
#include "device_ops.hpp"

namespace ddp {

using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

struct DistributedDataParallel::Impl {
  struct Bucket {
    std::unique_ptr<GroupMemory> memory;  // host: from the group, peers reach it without copies
    Tensor device_memory;                 // GPU: device memory (the NCCL member reduces it)
    Tensor grads;                         // 1 × n view of the flat gradients, in one of the two
    Buffer buffer() const {
      return Buffer{const_cast<float*>(grads.data()), grads.size(), DType::F32, grads.device()};
    }
    FlatGroup group;                    // layout: slots in bucket order, padding
    std::vector<Parameter*> params;     // in bucket order (reverse registration order)
    size_t pending = 0;                 // gradients not yet final in this backward
    Work work;                          // the running reduction (all_reduce or reduce_scatter)
    Work gather;                        // bf16 + AllReduce: the all_gather chained after `work`
    Clock::time_point launched;
    // ReduceScatter mode, world > 1: this rank's reduced shard, 1 x group.shard()
    // (kept between steps; at world 1 the shard is the bucket itself).
    Tensor shard;
    // grad_dtype BF16: the bucket rounded for the wire, 1 x padded (from the group).
    std::unique_ptr<GroupMemory> staging;
  };

  Impl(Module& model, std::shared_ptr<ProcessGroup> pg, const DdpOptions& options);
  ~Impl();
  const Tensor& backward(const Tensor& dy, bool need_dx);
  void on_grad_ready(Parameter& p);
  void launch_ready_buckets();
  void reduce_bucket(Bucket& b, bool async);
  void settle() noexcept;
  Tensor shard_grads(size_t i);
  MemoryStats memory() const;
  float clip_grad_norm(float max_norm);

  Module& model_;
  std::shared_ptr<ProcessGroup> pg_;
  DdpOptions options_;
  Device device_ = Device::Cpu;  // where every parameter, and so every bucket, lives
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, size_t> bucket_of_;
  std::vector<Parameter*> params_;
  size_t next_to_launch_ = 0;  // buckets start strictly in index order
  Clock::time_point backward_start_;
  Clock::time_point last_ready_;  // the latest grad-ready hook of this backward
  Clock::duration inline_comm_{};  // the last bucket's all-reduce, run inside backward
  bool sync_ = true;               // false while a NoSync guard lives
  uint64_t backwards_ = 0;
  BackwardStats stats_;
};

DistributedDataParallel::Impl::Impl(Module& model, std::shared_ptr<ProcessGroup> pg, const DdpOptions& options)
    : model_(model), pg_(std::move(pg)), options_(options) {
  params_ = model_.parameters();
  if (params_.empty()) throw InvalidArgument("DistributedDataParallel: the model has no parameters");
  if (!pg_) throw InvalidArgument("DistributedDataParallel: no process group");
  device_ = params_.front()->device();
  for (const Parameter* p : params_) {
    if (p->device() != device_) {
      throw InvalidArgument("DistributedDataParallel: '" + p->name + "' is on " + device_name(p->device()) + " but '" +
                            params_.front()->name + "' on " + device_name(device_) + " (move the whole model)");
    }
  }

  if (options_.grad_dtype != DType::F32 && options_.grad_dtype != DType::BF16) {
    throw InvalidArgument(std::string("DistributedDataParallel: grad_dtype ") + dtype_name(options_.grad_dtype) +
                          " is not supported (f32 or bf16)");
  }
  if (options_.grad_dtype == DType::BF16 && device_ == Device::Cuda) {
    // The widening bf16 -> f32 reduce_scatter exists on host buffers only.
    throw InvalidArgument("DistributedDataParallel: grad_dtype bf16 needs a model on the host (Device::Cpu)");
  }
  // Buckets in reverse registration order: the order backward finishes them. They are
  // padded to a multiple of the world size only where a reduce-scatter splits them.
  const bool split = options_.grad_dtype != DType::F32 || options_.reduce == GradReduce::ReduceScatter;
  for (FlatGroup& g : bucket_groups(params_, options_.first_bucket_bytes, options_.bucket_cap_bytes,
                                    split ? pg_->size() : 1)) {
    buckets_.emplace_back();
    for (const ShardSlot& s : g.slots) buckets_.back().params.push_back(s.param);
    buckets_.back().group = std::move(g);
  }
  // Each grad becomes a view into its bucket (keeping what it held).
  for (size_t i = 0; i < buckets_.size(); ++i)
    for (Parameter* p : buckets_[i].params) bucket_of_[p] = i;
  for (auto& bucket : buckets_) {
    const size_t n = bucket.group.padded;
    float* memory = nullptr;
    if (device_ == Device::Cuda) {
      // GPU buckets: plain device memory, which the group's NCCL member reduces.
      bucket.device_memory = Tensor(1, n, Device::Cuda);
      bucket.device_memory.zero();
      memory = bucket.device_memory.data();
    } else {
      // Shared with the local peers where possible, so the all-reduce reads and writes
      // their buckets directly (zero-filled).
      bucket.memory = pg_->allocate(n * sizeof(float));
      memory = reinterpret_cast<float*>(bucket.memory->data());
    }
    bucket.grads = Tensor::view(memory, 1, n, device_);
    for (const ShardSlot& s : bucket.group.slots) s.param->bind_grad(memory + s.offset);  // keeps what it held
    const size_t shard = bucket.group.shard();
    if (options_.reduce == GradReduce::ReduceScatter) {
      // World 1: the bucket is its own shard (nothing to reduce), so no copy.
      bucket.shard = pg_->size() > 1 ? Tensor(1, shard, device_) : Tensor::view(memory, 1, n, device_);
      if (pg_->size() > 1) bucket.shard.zero();
    }
    if (options_.grad_dtype == DType::BF16 && pg_->size() > 1) {
      // From the group: peers on this host may read it in place.
      bucket.staging = pg_->allocate(n * sizeof(BFloat16));
    }
  }
  if (options_.broadcast_parameters && pg_->size() > 1) {
    // One broadcast of every value, flattened, instead of one per parameter.
    size_t total = 0;
    for (Parameter* p : params_) total += p->numel();
    Tensor flat(1, total, device_);
    size_t off = 0;
    for (Parameter* p : params_) {
      Tensor::view(flat.data() + off, p->value.rows(), p->value.cols(), device_).copy_from(p->value);
      off += p->numel();
    }
    pg_->broadcast(Buffer{flat.data(), total, DType::F32, device_}, 0);
    off = 0;
    for (Parameter* p : params_) {
      p->value.copy_from(Tensor::view(flat.data() + off, p->value.rows(), p->value.cols(), device_));
      off += p->numel();
    }
  }
}

DistributedDataParallel::Impl::~Impl() {
  // Never leave an all-reduce writing into buckets that are about to go away.
  for (auto& b : buckets_) wait_all_noexcept({&b.work, &b.gather});
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : impl_->buckets_) {
    out.emplace_back();
    for (const Parameter* p : b.params) out.back().push_back(p->name);
  }
  return out;
}

void DistributedDataParallel::Impl::on_grad_ready(Parameter& p) {
  auto it = bucket_of_.find(&p);
  if (it == bucket_of_.end()) throw Error("DistributedDataParallel: '" + p.name + "' is not a parameter of the model");
  Bucket& b = buckets_[it->second];
  if (b.pending == 0) {
    throw Error("DistributedDataParallel: gradient of '" + p.name + "' reported ready twice in one backward");
  }
  --b.pending;
  last_ready_ = Clock::now();
  launch_ready_buckets();
}

// Starts, in bucket order, every bucket whose gradients are all final.
void DistributedDataParallel::Impl::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    Bucket& b = buckets_[next_to_launch_++];
    b.launched = Clock::now();
    // The last bucket fills when backward has nothing left to compute: there is
    // nothing to overlap it with, so it runs on this thread (no hand-off to the
    // progress thread; it still starts after every earlier bucket).
    const bool last = next_to_launch_ == buckets_.size();
    if (stats_.first_launch < 0) stats_.first_launch = seconds(b.launched - backward_start_);
    reduce_bucket(b, !last);
    if (last) inline_comm_ = Clock::now() - b.launched;  // communication, though on backward's clock
  }
}

// Starts bucket b's reduction (average over ranks), as the options say:
//   f32 AllReduce:      all_reduce of the bucket.
//   f32 ReduceScatter:  reduce_scatter of the bucket into b.shard.
//   bf16:               this thread rounds the bucket to bf16 once (the only rounding),
//                       then a widening reduce_scatter (bf16 -> f32, summed in f32 in rank
//                       order); AllReduce mode writes it into block rank() of the bucket and
//                       chains an in-place all_gather of that block over the bucket. Both
//                       are issued back to back: the group runs them in issue order, so no
//                       host wait in between, and every rank ends with copies of the same
//                       f32 shards (bit-identical).
void DistributedDataParallel::Impl::reduce_bucket(Bucket& b, bool async) {
  const CollectiveOptions o{.async_op = async};
  const bool scatter = options_.reduce == GradReduce::ReduceScatter;
  const size_t shard = b.group.shard();
  Buffer bucket = b.buffer();
  Buffer shard_out = scatter ? Buffer{b.shard.data(), shard, DType::F32, device_}
                             : Buffer{b.grads.data() + shard * static_cast<size_t>(pg_->rank()), shard, DType::F32, device_};
  if (options_.grad_dtype == DType::BF16) {
    auto* wire = reinterpret_cast<BFloat16*>(b.staging->data());
    round_to_bf16(b.grads.data(), wire, b.group.padded);
    b.work = pg_->reduce_scatter(Buffer{wire, b.group.padded, DType::BF16, device_}, shard_out, ReduceOp::Avg, o);
    if (!scatter) b.gather = pg_->all_gather(shard_out, bucket, o);
  } else if (scatter) {
    b.work = pg_->reduce_scatter(bucket, shard_out, ReduceOp::Avg, o);
  } else {
    b.work = pg_->all_reduce(bucket, ReduceOp::Avg, o);
  }
}

// Waits for every all-reduce started so far (errors are left to the caller's path):
// no reduction of this rank may still write into a bucket when backward() leaves or
// starts over. (After a failure, a live peer's share may still land in a shared
// bucket: memory-safe, and the gradients of a failed step are undefined anyway.)
void DistributedDataParallel::Impl::settle() noexcept {
  for (size_t i = 0; i < next_to_launch_ && i < buckets_.size(); ++i) {
    wait_all_noexcept({&buckets_[i].work, &buckets_[i].gather});
  }
}

const Tensor& DistributedDataParallel::Impl::backward(const Tensor& dy, bool need_dx) {
  settle();  // after an earlier backward that threw
  ++backwards_;
  const bool reduce = sync_ && options_.all_reduce && pg_->size() > 1;
  for (auto& b : buckets_) b.pending = b.params.size();
  next_to_launch_ = 0;
  stats_ = BackwardStats{};
  inline_comm_ = {};
  const auto t0 = backward_start_ = Clock::now();
  const Tensor* dx = nullptr;
  if (reduce) {
    try {
      dx = &model_.backward(dy, [this](Parameter& p) { on_grad_ready(p); }, need_dx);
    } catch (...) {
      settle();
      throw;
    }
  } else {
    dx = &model_.backward(dy, GradReadyHook{}, need_dx);
  }
  const auto t1 = Clock::now();
  stats_.backward = seconds(t1 - t0 - inline_comm_);
  if (!reduce) {
    if (sync_ && options_.reduce == GradReduce::ReduceScatter && pg_->size() > 1) {
      // Reduction switched off (measurement): the shard is this rank's local slice.
      for (auto& b : buckets_) {
        const size_t shard = b.group.shard();
        b.shard.copy_from(Tensor::view(b.grads.data() + shard * static_cast<size_t>(pg_->rank()), 1, shard, device_));
      }
    }
    if (sync_) report_step();  // a step of its own (one rank, or reduction switched off)
    return *dx;
  }
  if (next_to_launch_ != buckets_.size()) {
    settle();
    throw Error("DistributedDataParallel: backward finished but " + std::to_string(buckets_.size() - next_to_launch_) +
                " bucket(s) did not receive every gradient (a parameter without a gradient?)");
  }
  const char* label = options_.reduce == GradReduce::ReduceScatter ? "reduce_scatter bucket" : "all_reduce bucket";
  for (auto& b : buckets_) {
    for (Work* w : {&b.work, &b.gather}) {
      try {
        w->wait();
      } catch (...) {
        settle();  // the other buckets' reductions may still be writing them
        throw;
      }
      const auto t = w->timing();
      if (!t.known) continue;
      stats_.comm_busy += seconds(t.end - t.start);
      if (options_.trace) options_.trace->add(w == &b.gather ? "all_gather bucket" : label, t.start, t.end, Trace::kCommunication);
    }
    b.gather = Work{};
  }
  stats_.comm_wait = seconds(Clock::now() - t1 + inline_comm_);
  // Overlap, from the clock: buckets launched before the last gradient was ready
  // had compute left to hide behind.
  stats_.last_grad_ready = seconds(last_ready_ - t0);
  for (const auto& b : buckets_) stats_.buckets_overlapped += b.launched < last_ready_ ? 1 : 0;
  stats_.buckets_reduced = static_cast<int>(buckets_.size());
  report_step();  // gradients are final on every rank: the optimizer step follows
  return *dx;
}

Tensor DistributedDataParallel::Impl::shard_grads(size_t i) {
  if (options_.reduce != GradReduce::ReduceScatter) {
    throw InvalidArgument("DistributedDataParallel::shard_grads: the buckets are all-reduced (GradReduce::AllReduce)");
  }
  if (i >= buckets_.size()) {
    throw InvalidArgument("DistributedDataParallel::shard_grads: bucket " + std::to_string(i) + " of " +
                          std::to_string(buckets_.size()));
  }
  Tensor& s = buckets_[i].shard;
  return Tensor::view(s.data(), 1, s.size(), device_);
}

MemoryStats DistributedDataParallel::Impl::memory() const {
  MemoryStats m;
  for (const Parameter* p : params_) m.params += p->numel() * sizeof(float);
  for (const auto& b : buckets_) {
    m.grads += b.group.padded * sizeof(float);
    if (options_.reduce == GradReduce::ReduceScatter && pg_->size() > 1) m.comm += b.shard.size() * sizeof(float);
    if (b.staging) m.comm += b.group.padded * sizeof(BFloat16);
  }
  return m;
}

float DistributedDataParallel::Impl::clip_grad_norm(float max_norm) {
  if (options_.reduce == GradReduce::ReduceScatter) {
    // Only this rank's shard is reduced: the norm needs every rank's shard.
    throw InvalidArgument(
        "DistributedDataParallel::clip_grad_norm: with GradReduce::ReduceScatter only shards are reduced; "
        "clip with the sharded optimizer (ShardedOptimizer::clip_grad_norm)");
  }
  double sq = 0;
  for (const auto& b : buckets_) {
    if (device_ == Device::Cuda) {
      sq += detail::device::sum_squares(b.grads.data(), b.grads.size());
    } else {
      for (float g : b.grads.span()) sq += static_cast<double>(g) * g;
    }
  }
  const float norm = static_cast<float>(std::sqrt(sq));
  if (norm > max_norm && norm > 0) {
    const float scale = max_norm / (norm + 1e-6f);
    for (auto& b : buckets_) b.grads.scale(scale);
  }
  return norm;
}

// ---- the public face ------------------------------------------------------------

DistributedDataParallel::DistributedDataParallel(Module& model, std::shared_ptr<ProcessGroup> pg,
                                                 const DdpOptions& options)
    : impl_(std::make_unique<Impl>(model, std::move(pg), options)) {}
DistributedDataParallel::~DistributedDataParallel() = default;

const Tensor& DistributedDataParallel::forward(const Tensor& x) { return impl_->model_.forward(x); }
void DistributedDataParallel::backward(const Tensor& dy) { impl_->backward(dy, false); }
const Tensor& DistributedDataParallel::backward(const Tensor& dy, bool need_dx) { return impl_->backward(dy, need_dx); }
DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& d) : d_(&d) { d.impl_->sync_ = false; }
DistributedDataParallel::NoSync::~NoSync() {
  if (d_) d_->impl_->sync_ = true;
}
float DistributedDataParallel::clip_grad_norm(float max_norm) { return impl_->clip_grad_norm(max_norm); }
void DistributedDataParallel::zero_grad() {
  for (auto& b : impl_->buckets_) b.grads.zero();
}
std::vector<Parameter*> DistributedDataParallel::parameters() { return impl_->model_.parameters(); }
Module& DistributedDataParallel::module() { return impl_->model_; }
ProcessGroup& DistributedDataParallel::process_group() { return *impl_->pg_; }
const BackwardStats& DistributedDataParallel::last_backward() const { return impl_->stats_; }
uint64_t DistributedDataParallel::backwards() const { return impl_->backwards_; }
size_t DistributedDataParallel::num_buckets() const { return impl_->buckets_.size(); }
const FlatGroup& DistributedDataParallel::bucket_group(size_t i) const { return impl_->buckets_.at(i).group; }
Tensor DistributedDataParallel::bucket_grads(size_t i) {
  Tensor& grads = impl_->buckets_.at(i).grads;
  return Tensor::view(grads.data(), 1, grads.size(), impl_->device_);
}
Tensor DistributedDataParallel::shard_grads(size_t i) { return impl_->shard_grads(i); }
MemoryStats DistributedDataParallel::memory() const { return impl_->memory(); }
const DdpOptions& DistributedDataParallel::options() const { return impl_->options_; }

}  // namespace ddp
