// ddp_checks: a program the DDP tests launch under the real ddprun; it checks
// DistributedDataParallel's promises against a real process group, on synthetic
// inputs (these are properties of the mechanism, not of a dataset):
//
//   - construction copies rank 0's parameters to every rank (each rank built its
//     model from its own seed);
//   - buckets hold the parameters in reverse registration order, the first up to
//     first_bucket_bytes and the rest up to bucket_cap_bytes, each as full as the cap
//     allows;
//   - every bucket but the last starts its all-reduce before the last gradient of
//     backward is ready (measured on the clock: a DDP that launched everything at
//     the end of backward would fail);
//   - after every step of training on different data, every rank's parameters are
//     bit-identical;
//   - inside no_sync() nothing is reduced (each rank keeps its own gradients); the
//     next backward reduces the accumulated sum: the average over ranks of each
//     rank's accumulated gradients;
//   - clip_grad_norm scales to the requested global norm and returns the old one;
//   - GradReduce::ReduceScatter: shard_grads(i) is this rank's slice of what the
//     all-reduce mode gives for bucket i (same data, same bucket layout), padding 0;
//     the shards are counted in memory().comm and clip_grad_norm refuses;
//   - round_to_bf16 gives to_bfloat16's bits (ties, NaN, infinities, subnormals);
//   - grad_dtype BF16 (AdamW, 20 steps): every rank's parameters are bit-identical
//     after every step; in ReduceScatter mode the shard is bit for bit the slice the
//     all-reduce mode gathered; the bf16 staging is counted in memory().comm.
//
// Prints "rank R: N checks, F failed" last; exits 0 only when nothing failed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ddp/bf16.hpp"
#include "ddp/distributed_data_parallel.hpp"
#include "ddp/init.hpp"
#include "ddp/nn.hpp"
#include "ddp/optim.hpp"
#include "launched_checks.hpp"

namespace {

using launched::check;
using launched::g_rank;
using launched::hash_params;
using launched::same_everywhere;

// A batch that differs per rank and per step, for the 10-class MLP below.
void fill_batch(ddp::Tensor& x, std::vector<int32_t>& y, size_t batch, size_t features, int rank, int step) {
  launched::fill_batch(x, y, batch, features, 10, rank, step);
}

std::vector<float> grads_of(ddp::Module& m) {
  std::vector<float> g;
  for (auto* p : m.parameters()) g.insert(g.end(), p->grad.data(), p->grad.data() + p->numel());
  return g;
}

// Small buckets, so the MLP spreads over five: 16 KiB, then 32 KiB (one parameter,
// 96 x 128 floats, is larger than the cap and gets a bucket of its own).
constexpr size_t kFirstBucket = 16 << 10, kBucketCap = 32 << 10;
const std::vector<size_t> kSizes = {64, 128, 96, 64, 10};

void construction_and_layout(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  // Each rank starts from its own seed; rank 0's values must win.
  auto model = ddp::make_mlp({.sizes = kSizes, .seed = 100 + static_cast<uint64_t>(pg->rank())});
  auto reference = ddp::make_mlp({.sizes = kSizes, .seed = 100});
  if (pg->size() > 1) check(hash_params(*model) != hash_params(*reference) || pg->rank() == 0, "seeds differ");
  ddp::DistributedDataParallel ddp(*model, pg, {.first_bucket_bytes = kFirstBucket, .bucket_cap_bytes = kBucketCap});
  check(hash_params(*model) == hash_params(*reference), "construction broadcasts rank 0's parameters");

  // Layout: reverse registration order, caps respected, each bucket as full as allowed.
  const auto params = model->parameters();
  std::vector<std::string> reversed;
  for (auto it = params.rbegin(); it != params.rend(); ++it) reversed.push_back((*it)->name);
  std::vector<std::string> flat;
  const auto layout = ddp.bucket_layout();
  size_t next = 0;  // index into the reversed parameters
  bool caps_ok = true;
  for (size_t b = 0; b < layout.size(); ++b) {
    const size_t cap = b == 0 ? kFirstBucket : kBucketCap;
    size_t bytes = 0;
    for (const auto& name : layout[b]) {
      flat.push_back(name);
      bytes += params[params.size() - 1 - next++]->numel() * sizeof(float);
    }
    // Over the cap only as a single parameter too large for any bucket.
    if (bytes > cap && layout[b].size() > 1) caps_ok = false;
    // Full: the next parameter would not have fitted.
    if (next < params.size() && bytes + params[params.size() - 1 - next]->numel() * sizeof(float) <= cap) caps_ok = false;
  }
  check(flat == reversed, "buckets hold the parameters in reverse registration order");
  check(caps_ok, "first bucket up to first_bucket_bytes, then up to bucket_cap_bytes, each filled");
  check(layout.size() == 5, "the test model spans five buckets (" + std::to_string(layout.size()) + ")");
}

void training_steps(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  auto model = ddp::make_mlp({.sizes = kSizes, .seed = 7});
  ddp::DistributedDataParallel ddp(*model, pg, {.first_bucket_bytes = kFirstBucket, .bucket_cap_bytes = kBucketCap});
  ddp::SGD opt(model->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  const int buckets = static_cast<int>(ddp.bucket_layout().size());
  ddp::Tensor x, dlogits;
  std::vector<int32_t> y;
  bool identical = true, overlapped = true, early = true;
  for (int step = 0; step < 20; ++step) {
    fill_batch(x, y, 32, kSizes.front(), pg->rank(), step);
    ddp::softmax_cross_entropy(ddp.forward(x), y, dlogits);
    ddp.backward(dlogits);
    const auto& s = ddp.last_backward();
    if (pg->size() > 1) {
      overlapped &= s.buckets_reduced == buckets && s.buckets_overlapped == buckets - 1;
      early &= s.first_launch >= 0 && s.first_launch < s.last_grad_ready;
    }
    opt.step();
    ddp.zero_grad();
    identical &= same_everywhere(*pg, hash_params(*model));
  }
  check(identical, "parameters are bit-identical on every rank after every step");
  check(overlapped, "every bucket but the last starts its all-reduce during backward");
  check(early, "the first bucket's all-reduce starts before the last gradient is ready");
}

void accumulation(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  const int n = pg->size();
  auto model = ddp::make_mlp({.sizes = kSizes, .seed = 11});
  ddp::DistributedDataParallel ddp(*model, pg, {.first_bucket_bytes = kFirstBucket, .bucket_cap_bytes = kBucketCap});
  ddp::Tensor x, dlogits;
  std::vector<int32_t> y;
  // Micro-batch 1 inside no_sync: each rank keeps its own gradient.
  fill_batch(x, y, 16, kSizes.front(), pg->rank(), 1000);
  ddp::softmax_cross_entropy(ddp.forward(x), y, dlogits);
  {
    auto guard = ddp.no_sync();
    ddp.backward(dlogits);
  }
  check(ddp.last_backward().buckets_reduced == 0, "no_sync: no bucket is reduced");
  const std::vector<float> local_first = grads_of(*model);
  if (n > 1) check(!same_everywhere(*pg, launched::hash_floats(local_first)), "no_sync: gradients stay local (ranks differ)");

  // What the reduced result must be: the rank average of (micro 1 + micro 2) of each
  // rank, computed here from every rank's local sums with a plain all-reduce.
  auto twin = ddp::make_mlp({.sizes = kSizes, .seed = 11});
  for (size_t i = 0; i < twin->parameters().size(); ++i) {
    twin->parameters()[i]->value.copy_from(model->parameters()[i]->value);
  }
  ddp::Tensor tx, tdl;
  std::vector<int32_t> ty;
  for (int m : {1000, 1001}) {
    fill_batch(tx, ty, 16, kSizes.front(), pg->rank(), m);
    ddp::softmax_cross_entropy(twin->forward(tx), ty, tdl);
    twin->backward(tdl, {}, false);
  }
  std::vector<float> want = grads_of(*twin);
  pg->all_reduce(ddp::view(want), ddp::ReduceOp::Avg);

  // Micro-batch 2 synchronises everything accumulated.
  fill_batch(x, y, 16, kSizes.front(), pg->rank(), 1001);
  ddp::softmax_cross_entropy(ddp.forward(x), y, dlogits);
  ddp.backward(dlogits);
  // (One rank alone has nothing to reduce.)
  check(ddp.last_backward().buckets_reduced == (n > 1 ? static_cast<int>(ddp.bucket_layout().size()) : 0),
        "the backward after no_sync reduces every bucket");
  const std::vector<float> got = grads_of(*model);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  // Same sums in a different order of float additions: a few ulps of values ~1e-2.
  check(got.size() == want.size() && worst < 1e-6,
        "accumulated gradients are averaged over ranks (max diff " + std::to_string(worst) + ")");
}

void clipping(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  auto model = ddp::make_mlp({.sizes = {4, 3, 2}, .seed = 3});
  ddp::DistributedDataParallel ddp(*model, pg);
  // Gradients 1, 2, 3... in parameter order (identical on every rank, as after backward).
  double sq = 0;
  float v = 1;
  for (auto* p : model->parameters())
    for (float& g : p->grad.span()) {
      g = v;
      sq += static_cast<double>(v) * v;
      v += 1;
    }
  const double norm = std::sqrt(sq);
  const float returned = ddp.clip_grad_norm(5.0f);
  check(std::fabs(returned - norm) < 1e-4 * norm, "clip_grad_norm returns the norm before clipping");
  double after = 0;
  for (auto* p : model->parameters())
    for (float g : p->grad.span()) after += static_cast<double>(g) * g;
  check(std::fabs(std::sqrt(after) - 5.0) < 1e-4, "clip_grad_norm scales to the requested norm");
  const std::vector<float> kept = grads_of(*model);
  ddp.clip_grad_norm(100.0f);  // already below: unchanged
  check(grads_of(*model) == kept, "clip_grad_norm leaves gradients below the bound alone");
}

// The largest |a - b| over max |b| (0 when both are all zeros).
double relative_difference(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

void reduce_scatter_mode(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  const ddp::DdpOptions all{.first_bucket_bytes = kFirstBucket, .bucket_cap_bytes = kBucketCap};
  ddp::DdpOptions scattered = all;
  scattered.reduce = ddp::GradReduce::ReduceScatter;
  auto model_a = ddp::make_mlp({.sizes = kSizes, .seed = 21});
  auto model_s = ddp::make_mlp({.sizes = kSizes, .seed = 21});
  ddp::DistributedDataParallel ddp_a(*model_a, pg, all);
  ddp::DistributedDataParallel ddp_s(*model_s, pg, scattered);
  const size_t rank = static_cast<size_t>(pg->rank());
  bool layout = ddp_a.num_buckets() == ddp_s.num_buckets(), padding = true;
  double worst = 0;
  size_t shards_bytes = 0;
  ddp::Tensor x, dlogits;
  std::vector<int32_t> y;
  for (int step = 0; step < 3 && layout; ++step) {
    fill_batch(x, y, 32, kSizes.front(), pg->rank(), 500 + step);
    for (auto* d : {&ddp_a, &ddp_s}) {
      d->zero_grad();
      ddp::softmax_cross_entropy(d->forward(x), y, dlogits);
      d->backward(dlogits);
    }
    shards_bytes = 0;
    for (size_t i = 0; i < ddp_s.num_buckets(); ++i) {
      const ddp::FlatGroup& g = ddp_s.bucket_group(i);
      layout &= g.numel == ddp_a.bucket_group(i).numel && g.padded % static_cast<size_t>(pg->size()) == 0;
      const ddp::Tensor shard = ddp_s.shard_grads(i);
      const ddp::Tensor full = ddp_a.bucket_grads(i);
      layout &= shard.size() == g.shard();
      shards_bytes += shard.size() * sizeof(float);
      // Elements of the shard past numel are padding: zero. The rest match the slice.
      const size_t from = rank * g.shard(), real = from < g.numel ? std::min(g.shard(), g.numel - from) : 0;
      for (size_t k = real; k < shard.size(); ++k) padding &= shard.data()[k] == 0.0f;
      worst = std::max(worst, relative_difference(std::span(shard.data(), real), std::span(full.data() + from, real)));
    }
  }
  check(layout, "ReduceScatter mode: the same buckets, padded to a multiple of the world size");
  check(padding, "ReduceScatter mode: the shard's padding stays zero");
  // Two ranks add a + b either way; three fold in another order than the all-reduce.
  const double bound = pg->size() <= 2 ? 0.0 : 1e-6;
  if (rank == 0) std::printf("rank 0: reduce_scatter shard vs all_reduce slice, max relative difference %.3g\n", worst);
  check(worst <= bound, "ReduceScatter mode: shard_grads is the all-reduced bucket's slice (max relative difference " +
                            std::to_string(worst) + ")");
  check(ddp_s.memory().comm == (pg->size() > 1 ? shards_bytes : 0), "ReduceScatter mode: memory().comm counts the shards");
  bool refused = false;
  try {
    ddp_s.clip_grad_norm(1.0f);
  } catch (const ddp::InvalidArgument&) {
    refused = true;
  }
  check(refused, "ReduceScatter mode: clip_grad_norm refuses (only shards are reduced)");
  if (pg->size() > 1) check(ddp_s.last_backward().comm_busy > 0, "ReduceScatter mode: comm_busy is recorded");
}

void bf16_rounding() {
  // Every 4099th bit pattern (all exponents, both signs) and the edge cases.
  std::vector<float> values;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 4099) {
    float f;
    const auto b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, 4);
    values.push_back(f);
  }
  for (uint32_t b : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                     0xffffffffu, 0x00000001u, 0x80008000u, 0x00000000u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &b, 4);
    values.push_back(f);
  }
  std::vector<ddp::BFloat16> got(values.size());
  ddp::round_to_bf16(values.data(), got.data(), values.size());
  size_t wrong = 0;
  for (size_t i = 0; i < values.size(); ++i) wrong += got[i].bits != ddp::to_bfloat16(values[i]).bits ? 1 : 0;
  check(wrong == 0, "round_to_bf16 gives to_bfloat16's bits (" + std::to_string(wrong) + " of " +
                        std::to_string(values.size()) + " differ)");
}

void bf16_steps(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  ddp::DdpOptions all{.first_bucket_bytes = kFirstBucket, .bucket_cap_bytes = kBucketCap, .grad_dtype = ddp::DType::BF16};
  ddp::DdpOptions scattered = all;
  scattered.reduce = ddp::GradReduce::ReduceScatter;
  auto model_a = ddp::make_mlp({.sizes = kSizes, .seed = 31});
  auto model_s = ddp::make_mlp({.sizes = kSizes, .seed = 31});
  ddp::DistributedDataParallel ddp_a(*model_a, pg, all);
  ddp::DistributedDataParallel ddp_s(*model_s, pg, scattered);
  ddp::AdamW opt(model_a->parameters(), {.lr = 1e-3f});
  const size_t rank = static_cast<size_t>(pg->rank());
  bool identical = true, same_shard = true;
  ddp::Tensor x, dlogits;
  std::vector<int32_t> y;
  for (int step = 0; step < 20; ++step) {
    fill_batch(x, y, 32, kSizes.front(), pg->rank(), 700 + step);
    // The shard model follows the trained one's values, so both see the same gradients.
    for (size_t i = 0; i < model_a->parameters().size(); ++i) {
      model_s->parameters()[i]->value.copy_from(model_a->parameters()[i]->value);
    }
    for (auto* d : {&ddp_a, &ddp_s}) {
      d->zero_grad();
      ddp::softmax_cross_entropy(d->forward(x), y, dlogits);
      d->backward(dlogits);
    }
    for (size_t i = 0; i < ddp_s.num_buckets(); ++i) {
      const ddp::Tensor shard = ddp_s.shard_grads(i);
      const float* slice = ddp_a.bucket_grads(i).data() + rank * shard.size();
      same_shard &= std::memcmp(shard.data(), slice, shard.size() * sizeof(float)) == 0;
    }
    opt.step();
    identical &= same_everywhere(*pg, hash_params(*model_a));
  }
  check(identical, "bf16 gradients: parameters are bit-identical on every rank after every step");
  check(same_shard, "bf16 gradients: the ReduceScatter shard is the all-reduce mode's slice, bit for bit");
  size_t staging = 0;
  for (size_t i = 0; i < ddp_a.num_buckets(); ++i) staging += ddp_a.bucket_group(i).padded * sizeof(ddp::BFloat16);
  check(ddp_a.memory().comm == (pg->size() > 1 ? staging : 0), "bf16 gradients: memory().comm counts the staging");
}

}  // namespace

int main() {
  try {
    auto pg = ddp::init({.backend = "cpu"});
    launched::g_rank = pg->rank();
    construction_and_layout(pg);
    training_steps(pg);
    accumulation(pg);
    clipping(pg);
    reduce_scatter_mode(pg);
    bf16_rounding();
    bf16_steps(pg);
    pg->barrier();
  } catch (const std::exception& e) {
    std::printf("rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
  return launched::finish();
}
