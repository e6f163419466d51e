// sharded_checks: a program the sharded tests launch under the real ddprun (2 and 3
// ranks); it checks ZeRO-1 (ZeroRedundancyOptimizer over DistributedDataParallel)
// against DDP with an unsharded optimizer, on synthetic per-rank batches (properties
// of the mechanism, not of a dataset). FSDP's checks are fsdp_checks'.
//
//   - equivalence: the same seed and data, 20 steps, AdamW and SGD with momentum, on
//     784-512-512-10 and on 13-37-29-5 (buckets that split unevenly: padding), in both
//     reduction modes; max |a - b| / max(max |b|, 1e-12) over the values <= 1e-6 (the
//     measured figure is printed), and in fact 0 at 2 and 3 ranks: one-host reductions
//     fold in rank order, so a reduce-scattered shard is the all-reduced bucket's slice
//     bit for bit, and the optimizers' rules are elementwise; reduce-scatter mode is
//     also exactly DDP's stepping on the same reduce-scattered gradients; every rank
//     holds bit-identical values after every step;
//   - bf16 gradients (rounded once per bucket, reduced in f32): every rank holds the
//     same values after every step;
//   - memory: ZeRO-1's optimizer bytes are DDP's AdamW's over N, plus the padding;
//   - checkpoints: on a 2-rank group, consolidate_state + save_state on rank 0 writes
//     the bytes of an unsharded AdamW after the same steps (other ranks refuse); those
//     bytes loaded at another world size save back unchanged and continue as an
//     unsharded AdamW loaded from them;
//   - clip_grad_norm: the global norm of the shards, as DDP's over the full buckets;
//     a step skipped after clipping leaves no stale gradients for the next one;
//   - gradient accumulation with no_sync: exactly DDP's;
//   - a ZeroOptions that does not match the DDP's reduction mode is refused; after
//     ZeRO-1 is gone the parameters own their values again.
//
// Prints "rank R: N checks, F failed" last; exits 0 only when nothing failed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/distributed_data_parallel.hpp"
#include "ddp/init.hpp"
#include "ddp/optim.hpp"
#include "ddp/zero_redundancy_optimizer.hpp"
#include "launched_checks.hpp"

namespace {

using launched::check;

struct ModelCase {
  const char* name;
  std::vector<size_t> sizes;
  size_t first_bucket, bucket_cap;  // small caps: several buckets
};
const ModelCase kWide{"784-512-512-10", {784, 512, 512, 10}, 64 << 10, 1 << 20};
const ModelCase kOdd{"13-37-29-5", {13, 37, 29, 5}, 2048, 4096};

// DdpSameGrads: DDP in reduce-scatter mode with an unsharded optimizer; the test
// all-gathers the reduced shards into the buckets, so it steps on exactly the gradients
// ZeRO-1's reduce-scatter mode steps on.
enum class Strategy { Ddp, DdpSameGrads, ZeroAllReduce, ZeroReduceScatter };
enum class Opt { AdamW, Sgd };

const char* name_of(Strategy s) {
  switch (s) {
    case Strategy::Ddp: return "ddp";
    case Strategy::DdpSameGrads: return "ddp(reduce_scatter, all_gather)";
    case Strategy::ZeroAllReduce: return "zero1(all_reduce)";
    case Strategy::ZeroReduceScatter: return "zero1(reduce_scatter)";
  }
  return "?";
}
const char* name_of(Opt o) { return o == Opt::AdamW ? "adamw" : "sgd"; }

ddp::OptimizerFactory factory(Opt o) {
  if (o == Opt::AdamW) {
    return [](std::vector<ddp::Parameter*> p) {
      return std::make_unique<ddp::AdamW>(std::move(p), ddp::AdamWOptions{.lr = 2e-3f, .weight_decay = 0.05f});
    };
  }
  return [](std::vector<ddp::Parameter*> p) {
    return std::make_unique<ddp::SGD>(std::move(p), ddp::SgdOptions{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f});
  };
}

// A model, its DDP and its optimizer (ZeRO-1's, or an unsharded one over the model's
// parameters), destroyed in reverse: the optimizer before the DDP before the model.
struct Trainer {
  const ModelCase& mc;
  std::unique_ptr<ddp::Sequential> model;
  std::unique_ptr<ddp::DistributedDataParallel> ddp;
  std::unique_ptr<ddp::Optimizer> opt;
  ddp::ZeroRedundancyOptimizer* zero = nullptr;
  bool gather_shards = false;

  // `values`: the parameter values to start from (flattened), instead of the seed's.
  Trainer(const std::shared_ptr<ddp::ProcessGroup>& pg, const ModelCase& c, Strategy s, Opt o,
          const std::vector<float>* values = nullptr, ddp::DType grad_dtype = ddp::DType::F32)
      : mc(c), model(ddp::make_mlp({.sizes = c.sizes, .seed = 5})), gather_shards(s == Strategy::DdpSameGrads) {
    if (values != nullptr) {
      size_t at = 0;
      for (auto* p : model->parameters()) {
        std::copy_n(values->begin() + static_cast<std::ptrdiff_t>(at), p->numel(), p->value.data());
        at += p->numel();
      }
    }
    const bool rs = s == Strategy::ZeroReduceScatter || s == Strategy::DdpSameGrads;
    const auto reduce = rs ? ddp::GradReduce::ReduceScatter : ddp::GradReduce::AllReduce;
    ddp = std::make_unique<ddp::DistributedDataParallel>(
        *model, pg, ddp::DdpOptions{.first_bucket_bytes = c.first_bucket,
                                          .bucket_cap_bytes = c.bucket_cap,
                                          .grad_dtype = grad_dtype,
                                          .reduce = reduce});
    if (s == Strategy::Ddp || s == Strategy::DdpSameGrads) {
      opt = factory(o)(model->parameters());
    } else {
      auto z = std::make_unique<ddp::ZeroRedundancyOptimizer>(
          *ddp, factory(o), ddp::ZeroOptions{.reduce_scatter = s == Strategy::ZeroReduceScatter});
      zero = z.get();
      opt = std::move(z);
    }
  }

  void backward(int rank, int step) {
    ddp::Tensor x, dlogits;
    std::vector<int32_t> y;
    launched::fill_batch(x, y, 16, mc.sizes.front(), mc.sizes.back(), rank, step);
    ddp::softmax_cross_entropy(ddp->forward(x), y, dlogits);
    ddp->backward(dlogits);
    if (!gather_shards) return;
    ddp::ProcessGroup& pg = ddp->process_group();
    for (size_t i = 0; i < ddp->num_buckets(); ++i) {
      ddp::Tensor shard = ddp->shard_grads(i), bucket = ddp->bucket_grads(i);
      pg.all_gather(ddp::Buffer{shard.data(), shard.size(), ddp::DType::F32, ddp::Device::Cpu},
                    ddp::Buffer{bucket.data(), bucket.size(), ddp::DType::F32, ddp::Device::Cpu});
    }
  }

  // Steps [from, to) on per-rank batches. Returns whether every rank of pg held the same
  // values after every step.
  bool train(ddp::ProcessGroup& pg, int from, int to) {
    bool identical = true;
    for (int step = from; step < to; ++step) {
      backward(pg.rank(), step);
      opt->step();
      ddp->zero_grad();
      identical &= launched::same_everywhere(pg, launched::hash_params(*model));
    }
    return identical;
  }
};

std::string saved(const ddp::Optimizer& opt) {
  std::ostringstream out;
  opt.save_state(out);
  return out.str();
}

void equivalence(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  constexpr int kSteps = 20;
  for (const ModelCase* mc : {&kWide, &kOdd}) {
    for (Opt o : {Opt::AdamW, Opt::Sgd}) {
      Trainer ref(pg, *mc, Strategy::Ddp, o);
      ref.train(*pg, 0, kSteps);
      Trainer same(pg, *mc, Strategy::DdpSameGrads, o);
      same.train(*pg, 0, kSteps);
      const std::vector<float> want = launched::values_of(*ref.model);
      for (Strategy s : {Strategy::ZeroAllReduce, Strategy::ZeroReduceScatter}) {
        Trainer z(pg, *mc, s, o);
        const bool identical = z.train(*pg, 0, kSteps);
        const std::vector<float> got = launched::values_of(*z.model);
        const double diff = launched::rel_diff(got, want);
        const std::string what = std::string(name_of(s)) + " " + name_of(o) + " " + mc->name + " at " +
                                 std::to_string(pg->size()) + " ranks";
        if (pg->rank() == 0) std::printf("rank 0: equivalence %s: max_rel_diff %.3g vs ddp\n", what.c_str(), diff);
        check(diff <= 1e-6, what + " matches DDP within 1e-6 (" + std::to_string(diff) + ")");
        // One-host reductions fold in rank order whatever the path (all_reduce's direct or
        // small exchange, reduce_scatter's direct fold): the same gradients at any world.
        check(diff == 0, what + " is exactly DDP's");
        if (s == Strategy::ZeroReduceScatter) {
          const double exact = launched::rel_diff(got, launched::values_of(*same.model));
          check(exact == 0, what + " is exactly DDP's on the same reduced gradients (" + std::to_string(exact) + ")");
        }
        check(identical, what + ": every rank holds the same values after every step");
      }
    }
  }
}

// bf16 gradient communication: each bucket is rounded once to bf16 and reduced in f32
// in rank order, then the values are all-gathered: every rank must hold the same bits.
void bf16(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  for (const ModelCase* mc : {&kWide, &kOdd}) {
    Trainer f32(pg, *mc, Strategy::Ddp, Opt::AdamW);
    f32.train(*pg, 0, 20);
    Trainer ref(pg, *mc, Strategy::Ddp, Opt::AdamW, nullptr, ddp::DType::BF16);
    ref.train(*pg, 0, 20);
    const std::vector<float> want = launched::values_of(*ref.model);
    for (Strategy s : {Strategy::ZeroAllReduce, Strategy::ZeroReduceScatter}) {
      Trainer z(pg, *mc, s, Opt::AdamW, nullptr, ddp::DType::BF16);
      const bool identical = z.train(*pg, 0, 20);
      const std::vector<float> got = launched::values_of(*z.model);
      const double diff = launched::rel_diff(got, want);
      const double from_f32 = launched::rel_diff(got, launched::values_of(*f32.model));
      const std::string what = std::string(name_of(s)) + " bf16 grads adamw " + mc->name;
      if (pg->rank() == 0) {
        std::printf("rank 0: %s: max_rel_diff %.3g vs bf16 ddp, %.3g vs f32 ddp\n", what.c_str(), diff, from_f32);
      }
      check(identical, what + ": every rank holds the same values after every step");
      // DDP's bf16 all-reduce is the same widening reduce-scatter followed by an
      // all-gather: the same gradients, so the same steps.
      check(diff == 0, what + " is exactly bf16 DDP's (" + std::to_string(diff) + ")");
      check(from_f32 > 0, what + ": the gradients did go through bf16");
    }
  }
}

void memory(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  Trainer ref(pg, kWide, Strategy::Ddp, Opt::AdamW);
  Trainer z(pg, kWide, Strategy::ZeroReduceScatter, Opt::AdamW);
  const ddp::MemoryStats m = z.zero->memory();
  size_t padding = 0, padded = 0, shards = 0;
  for (const auto& g : z.zero->groups()) {
    padding += g.padded - g.numel;
    padded += g.padded;
    shards += g.shard();
  }
  const size_t n = static_cast<size_t>(pg->size());
  const size_t ddp_state = ref.opt->state_bytes();
  if (pg->rank() == 0) {
    std::printf("rank 0: memory zero1 optimizer %zu bytes, ddp's AdamW %zu bytes (ratio %.4f, world %zu)\n", m.optimizer,
                ddp_state, static_cast<double>(m.optimizer) / static_cast<double>(ddp_state), n);
  }
  check(m.optimizer == z.zero->state_bytes(), "memory().optimizer is the optimizer's state_bytes()");
  // Two AdamW buffers per element: DDP's exactly over N once the padding is counted.
  check(m.optimizer * n == ddp_state + 2 * sizeof(float) * padding, "ZeRO-1's optimizer bytes are DDP's / N plus padding");
  check(m.params == padded * sizeof(float), "memory().params: the full (padded) values");
  check(m.grads == z.ddp->memory().grads, "memory().grads: DDP's grad buckets");
  check(pg->size() == 1 || m.comm >= shards * sizeof(float), "memory().comm counts the reduce-scatter outputs");
}

// The group that loads the checkpoint: a world other than the 2 ranks that saved it
// (every rank alone at 2 ranks; the whole 3-rank group at 3).
std::shared_ptr<ddp::ProcessGroup> other_world(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  if (pg->size() != 2) return pg;
  std::shared_ptr<ddp::ProcessGroup> mine;
  for (int r = 0; r < pg->size(); ++r) {
    auto g = pg->new_group({r});
    if (g) mine = g;
  }
  return mine;
}

void checkpoint(const std::shared_ptr<ddp::ProcessGroup>& pg, Strategy s) {
  const std::string mode = name_of(s);
  auto two = pg->new_group({0, 1});
  std::string bytes;
  std::vector<float> values;
  if (two) {
    Trainer ref(two, kOdd, Strategy::Ddp, Opt::AdamW);
    Trainer z(two, kOdd, s, Opt::AdamW);
    ref.train(*two, 0, 6);
    z.train(*two, 0, 6);
    z.zero->consolidate_state(0);
    if (two->rank() == 0) {
      bytes = saved(*z.opt);
      values = launched::values_of(*z.model);
      check(bytes == saved(*ref.opt), mode + ": consolidated save_state on 2 ranks writes an unsharded AdamW's bytes");
    } else {
      bool refused = false;
      try {
        saved(*z.opt);
      } catch (const ddp::InvalidArgument&) {
        refused = true;
      }
      check(refused, mode + ": save_state off the consolidation root throws InvalidArgument");
    }
  }
  // Rank 0 hands the checkpoint (optimizer bytes, values) to every rank.
  int64_t size = static_cast<int64_t>(bytes.size());
  pg->broadcast(ddp::view(std::span<int64_t>(&size, 1)), 0);
  bytes.resize(static_cast<size_t>(size));
  values.resize(launched::values_of(*ddp::make_mlp({.sizes = kOdd.sizes})).size());
  pg->broadcast(ddp::Buffer{bytes.data(), bytes.size(), ddp::DType::U8, ddp::Device::Cpu}, 0);
  pg->broadcast(ddp::view(values), 0);

  auto world = other_world(pg);
  Trainer ref(world, kOdd, Strategy::Ddp, Opt::AdamW, &values);
  Trainer z(world, kOdd, s, Opt::AdamW, &values);
  for (Trainer* t : {&ref, &z}) {
    std::istringstream in(bytes);
    t->opt->load_state(in);
  }
  const std::string where = mode + " saved at 2 ranks, loaded at " + std::to_string(world->size());
  z.zero->consolidate_state(0);
  if (world->rank() == 0) check(saved(*z.opt) == bytes, where + ": saves back the bytes it loaded");
  ref.train(*world, 6, 12);
  const bool identical = z.train(*world, 6, 12);
  const double diff = launched::rel_diff(launched::values_of(*z.model), launched::values_of(*ref.model));
  if (pg->rank() == 0) std::printf("rank 0: checkpoint %s: continued max_rel_diff %.3g vs ddp\n", where.c_str(), diff);
  check(identical, where + ": ranks identical after loading");
  check(diff <= 1e-6, where + ": continues as an unsharded AdamW loaded from the same bytes");
  if (s == Strategy::ZeroAllReduce) {
    check(diff == 0, where + ": continues exactly as an unsharded AdamW");
    z.zero->consolidate_state(0);
    if (world->rank() == 0) check(saved(*z.opt) == saved(*ref.opt), where + ": the next save is an unsharded AdamW's");
  }
}

void clipping(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  for (Strategy s : {Strategy::ZeroAllReduce, Strategy::ZeroReduceScatter}) {
    const std::string mode = name_of(s);
    Trainer ref(pg, kWide, Strategy::Ddp, Opt::Sgd);
    Trainer z(pg, kWide, s, Opt::Sgd);
    ref.backward(pg->rank(), 77);
    z.backward(pg->rank(), 77);
    const float want = ref.ddp->clip_grad_norm(0.05f);
    const float got = z.zero->clip_grad_norm(0.05f);
    check(std::fabs(got - want) <= 1e-5f * want, mode + ": clip_grad_norm returns DDP's global norm (" +
                                                     std::to_string(got) + " vs " + std::to_string(want) + ")");
    ref.opt->step();
    z.opt->step();  // on the clipped gradients (the copies, in all-reduce mode)
    const double diff = launched::rel_diff(launched::values_of(*z.model), launched::values_of(*ref.model));
    check(diff <= 1e-6, mode + ": a clipped step matches a clipped DDP step (" + std::to_string(diff) + ")");
    // Clipping and then skipping the step (as on a non-finite norm): the next step is on
    // the next backward's gradients, not on the clipped copies of this one.
    for (Trainer* t : {&ref, &z}) {
      t->ddp->zero_grad();
      t->backward(pg->rank(), 78);
    }
    ref.ddp->clip_grad_norm(1e-3f);
    z.zero->clip_grad_norm(1e-3f);
    for (Trainer* t : {&ref, &z}) {
      t->ddp->zero_grad();
      t->backward(pg->rank(), 79);
      t->opt->step();
    }
    const double skipped = launched::rel_diff(launched::values_of(*z.model), launched::values_of(*ref.model));
    check(skipped <= 1e-6, mode + ": a step skipped after clipping leaves nothing stale for the next one (" +
                               std::to_string(skipped) + ")");
  }
}

// Gradient accumulation: backwards inside no_sync() then one that reduces step ZeRO-1
// exactly as DDP's accumulated and reduced buckets (rank-order folds of the same sums).
void accumulation(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  for (Strategy s : {Strategy::ZeroAllReduce, Strategy::ZeroReduceScatter}) {
    Trainer ref(pg, kOdd, Strategy::Ddp, Opt::AdamW);
    Trainer z(pg, kOdd, s, Opt::AdamW);
    bool identical = true;
    for (Trainer* t : {&ref, &z}) {
      for (int step = 0; step < 3; ++step) {
        for (int micro = 0; micro < 2; ++micro) {
          auto guard = t->ddp->no_sync();
          t->backward(pg->rank(), 200 + 3 * step + micro);
        }
        t->backward(pg->rank(), 200 + 3 * step + 2);
        t->opt->step();
        t->ddp->zero_grad();
        identical &= launched::same_everywhere(*pg, launched::hash_params(*t->model));
      }
    }
    const double diff = launched::rel_diff(launched::values_of(*z.model), launched::values_of(*ref.model));
    const std::string what = std::string(name_of(s)) + " no_sync accumulation over 3 backwards x 3 steps";
    if (pg->rank() == 0) std::printf("rank 0: %s: max_rel_diff %.3g vs ddp\n", what.c_str(), diff);
    check(diff == 0, what + " is exactly DDP's (" + std::to_string(diff) + ")");
    check(identical, what + ": every rank holds the same values");
  }
}

void refusals(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  for (auto reduce : {ddp::GradReduce::AllReduce, ddp::GradReduce::ReduceScatter}) {
    auto model = ddp::make_mlp({.sizes = kOdd.sizes, .seed = 5});
    ddp::DistributedDataParallel d(*model, pg, {.reduce = reduce});
    const bool rs = reduce == ddp::GradReduce::ReduceScatter;
    bool refused = false;
    try {
      ddp::ZeroRedundancyOptimizer z(d, factory(Opt::AdamW), {.reduce_scatter = !rs});
    } catch (const ddp::InvalidArgument& e) {
      refused = std::string(e.what()).find(rs ? "GradReduce::AllReduce" : "GradReduce::ReduceScatter") != std::string::npos;
    }
    check(refused, std::string("a ZeroOptions that does not match a DDP built with ") +
                       (rs ? "ReduceScatter" : "AllReduce") + " is refused, naming the DDP option to use");
    check(model->parameters()[0]->materialized() && !model->parameters()[0]->value.is_view(),
          "a refused ZeRO-1 leaves the parameters' values as they were");
  }
}

// While ZeRO-1 lives the values are views of its flat buffers; afterwards the model
// owns them again, with the trained values.
void lifetime(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  Trainer t(pg, kOdd, Strategy::ZeroReduceScatter, Opt::AdamW);
  t.train(*pg, 0, 2);
  bool views = true;
  for (auto* p : t.model->parameters()) views &= p->value.is_view();
  check(views, "ZeRO-1 binds every parameter's value into its flat buffers");
  const std::vector<float> trained = launched::values_of(*t.model);
  t.opt.reset();
  bool owning = true;
  for (auto* p : t.model->parameters()) owning &= !p->value.is_view() && p->materialized();
  check(owning && launched::values_of(*t.model) == trained, "after ZeRO-1 the parameters own their trained values");
}

}  // namespace

int main() {
  try {
    auto pg = ddp::init({.backend = "cpu"});
    launched::g_rank = pg->rank();
    equivalence(pg);
    if (pg->size() >= 2) bf16(pg);
    memory(pg);
    if (pg->size() >= 2) {
      checkpoint(pg, Strategy::ZeroAllReduce);
      checkpoint(pg, Strategy::ZeroReduceScatter);
    }
    clipping(pg);
    accumulation(pg);
    refusals(pg);
    lifetime(pg);
    pg->barrier();
  } catch (const std::exception& e) {
    std::printf("rank %d: error: %s\n", launched::g_rank, e.what());
    return 1;
  }
  return launched::finish();
}
