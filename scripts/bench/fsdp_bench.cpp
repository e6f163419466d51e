// fsdp-bench [rounds]: indicative timings of DDP and FullyShardedDataParallel on the wide
// model 784-2048-2048-2048-10 at batch 64 (AdamW with its defaults), interleaved in rounds
// of a few steps each so that a busy machine slows them alike: step medians, FSDP's time
// split, the collectives alone on the largest unit, and (FSDP_BENCH_TRACE set) FSDP's last
// step as a timeline. Figures only: nothing is asserted. scripts/bench/fsdp runs it under
// ddprun; every rank prints its own lines.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ddp/distributed_data_parallel.hpp"
#include "ddp/fully_sharded_data_parallel.hpp"
#include "ddp/init.hpp"
#include "ddp/nn.hpp"
#include "ddp/optim.hpp"
#include "ddp/random.hpp"
#include "ddp/trace.hpp"

namespace {

int g_rank = 0;

// A synthetic batch for an MLP of `sizes` that differs per rank and per step (timings
// only: the values do not matter, their shapes do).
void fill_batch(ddp::Tensor& x, std::vector<int32_t>& y, size_t batch, const std::vector<size_t>& sizes, int rank,
                int step) {
  x.resize(batch, sizes.front());
  y.resize(batch);
  ddp::Rng rng(static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(step));
  for (float& v : x.span()) v = rng.uniform(-1.0f, 1.0f);
  for (auto& label : y) label = static_cast<int32_t>(rng.below(sizes.back()));
}

void bench(const std::shared_ptr<ddp::ProcessGroup>& pg, int rounds) {
  const std::vector<size_t> sizes = {784, 2048, 2048, 2048, 10};
  using Ms = std::vector<double>;
  auto median = [](Ms v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  auto since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  struct Timed {
    std::string name;
    std::function<void(int)> step;
    Ms step_ms, opt_ms, fwd_ms, bwd_ms, wait_ms, busy_ms;
  };
  ddp::Tensor x, dlogits;
  std::vector<int32_t> y;
  auto a = ddp::make_mlp({.sizes = sizes, .seed = 1});
  ddp::DistributedDataParallel ddp(*a, pg);
  ddp::AdamW adamw(a->parameters(), {});
  std::vector<std::unique_ptr<ddp::Sequential>> models;
  std::vector<std::unique_ptr<ddp::FullyShardedDataParallel>> fsdps;
  std::vector<std::unique_ptr<ddp::ShardedOptimizer>> opts;
  std::vector<Timed> runs;
  runs.reserve(4);  // the steps keep pointers to their entries
  runs.push_back({"ddp", {}, {}, {}, {}, {}, {}, {}});
  runs.back().step = [&, r = &runs.back()](int step) {
    fill_batch(x, y, 64, sizes, pg->rank(), step);
    const auto f0 = std::chrono::steady_clock::now();
    const auto& logits = ddp.forward(x);
    r->fwd_ms.push_back(since(f0));
    ddp::softmax_cross_entropy(logits, y, dlogits);
    ddp.backward(dlogits);
    const auto t0 = std::chrono::steady_clock::now();
    adamw.step();
    r->opt_ms.push_back(since(t0));
    ddp.zero_grad();
    const auto& st = ddp.last_backward();
    r->bwd_ms.push_back(st.backward * 1e3);
    r->wait_ms.push_back(st.comm_wait * 1e3);
    r->busy_ms.push_back(st.comm_busy * 1e3);
  };
  ddp::Trace trace(pg->rank());  // FSDP's last step, with FSDP_BENCH_TRACE set
  const bool traced = std::getenv("FSDP_BENCH_TRACE") != nullptr;
  const std::vector<std::pair<std::string, ddp::FsdpOptions>> configs = {
      {"fsdp", {.trace = traced ? &trace : nullptr}},
      {"fsdp_no_reshard", {.reshard_after_forward = false}},
      {"fsdp_bf16", {.grad_dtype = ddp::DType::BF16}}};
  for (const auto& [name, options] : configs) {
    models.push_back(ddp::make_mlp({.sizes = sizes, .seed = 1}));
    fsdps.push_back(std::make_unique<ddp::FullyShardedDataParallel>(*models.back(), pg, options));
    opts.push_back(fsdps.back()->make_optimizer(
        [](std::vector<ddp::Parameter*> p) { return std::make_unique<ddp::AdamW>(std::move(p), ddp::AdamWOptions{}); }));
    runs.push_back({name, {}, {}, {}, {}, {}, {}, {}});
    auto* f = fsdps.back().get();
    auto* o = opts.back().get();
    runs.back().step = [&, f, o, r = &runs.back()](int step) {
      fill_batch(x, y, 64, sizes, pg->rank(), step);
      ddp::softmax_cross_entropy(f->forward(x), y, dlogits);
      f->backward(dlogits);
      const auto t0 = std::chrono::steady_clock::now();
      o->step();
      r->opt_ms.push_back(since(t0));
      f->zero_grad();
      const auto& st = f->last_step();
      r->fwd_ms.push_back(st.forward * 1e3);
      r->bwd_ms.push_back(st.backward * 1e3);
      r->wait_ms.push_back(st.comm_wait * 1e3);
      r->busy_ms.push_back(st.comm_busy * 1e3);
    };
  }
  constexpr int kPerRound = 4;
  for (int round = 0; round <= rounds; ++round) {
    for (auto& r : runs) {
      for (int k = 0; k < kPerRound; ++k) {
        pg->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        r.step(round * kPerRound + k);
        if (round > 0) r.step_ms.push_back(since(t0));  // round 0 warms up
      }
    }
  }
  const double ddp_ms = median(runs[0].step_ms);
  for (auto& r : runs) {
    const double ms = median(r.step_ms);
    std::printf("rank %d: bench %s step_ms_median %.1f samples_per_s %.0f vs_ddp %.2f optimizer_ms %.1f", g_rank,
                r.name.c_str(), ms, 64.0 * pg->size() * 1000.0 / ms, ddp_ms / ms, median(r.opt_ms));
    if (!r.fwd_ms.empty()) {
      std::printf(" forward_ms %.1f backward_ms %.1f comm_busy_ms %.1f comm_wait_ms %.1f", median(r.fwd_ms),
                  median(r.bwd_ms), median(r.busy_ms), median(r.wait_ms));
    }
    std::printf("\n");
  }
  // The collectives FSDP and DDP use, alone, on the wide model's largest unit (16.8 MB):
  // where FSDP's communication time goes.
  {
    const size_t count = 2048 * 2048 + 2048;
    const size_t padded = (count + static_cast<size_t>(pg->size()) - 1) / pg->size() * pg->size();
    const size_t shard = padded / static_cast<size_t>(pg->size());
    ddp::Tensor full(1, padded), part(1, shard);
    auto shared = pg->allocate(padded * sizeof(float));
    auto wire = pg->allocate(padded * sizeof(ddp::BFloat16));
    auto f32 = [](float* p, size_t n) { return ddp::Buffer{p, n, ddp::DType::F32, ddp::Device::Cpu}; };
    const std::vector<std::pair<const char*, std::function<void()>>> ops = {
        {"all_gather f32 (FSDP's gathers)", [&] { pg->all_gather(f32(part.data(), shard), f32(full.data(), padded)); }},
        {"reduce_scatter f32 avg (FSDP's)", [&] { pg->reduce_scatter(f32(full.data(), padded), f32(part.data(), shard), ddp::ReduceOp::Avg); }},
        {"all_reduce f32 avg, group memory (DDP's, and FSDP's f32 reduction on one host)",
         [&] { pg->all_reduce(f32(reinterpret_cast<float*>(shared->data()), padded), ddp::ReduceOp::Avg); }},
        {"reduce_scatter bf16->f32 avg, group memory (FSDP's bf16 reduction)", [&] {
           pg->reduce_scatter(ddp::Buffer{wire->data(), padded, ddp::DType::BF16, ddp::Device::Cpu},
                              f32(part.data(), shard), ddp::ReduceOp::Avg);
         }}};
    for (const auto& [what, op] : ops) {
      Ms ms;
      for (int i = 0; i < 12; ++i) {
        pg->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        op();
        if (i >= 2) ms.push_back(since(t0));
      }
      std::printf("rank %d: bench alone, %.1f MB: %s %.1f ms\n", g_rank, padded * 4 / 1e6, what, median(ms));
    }
  }
  if (traced) {
    // The last traced step's events, in ms from its first one.
    const std::regex event(R"re("ts":([0-9.]+),"dur":([0-9.]+),"name":"([^"]+)")re");
    const std::string json = trace.json_events();
    std::vector<std::tuple<double, double, std::string>> evs;
    for (auto it = std::sregex_iterator(json.begin(), json.end(), event); it != std::sregex_iterator(); ++it)
      evs.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]), (*it)[3]);
    std::sort(evs.begin(), evs.end());
    const size_t per_step = evs.size() / static_cast<size_t>((rounds + 1) * kPerRound);
    const double t0 = std::get<0>(evs[evs.size() - per_step]);
    for (size_t i = evs.size() - per_step; i < evs.size(); ++i) {
      std::printf("rank %d: trace %7.1f ms +%6.1f ms %s\n", g_rank, (std::get<0>(evs[i]) - t0) / 1e3,
                  std::get<1>(evs[i]) / 1e3, std::get<2>(evs[i]).c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto pg = ddp::init({.backend = "cpu"});
    g_rank = pg->rank();
    bench(pg, argc > 1 ? std::stoi(argv[1]) : 5);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: fsdp-bench: %s\n", g_rank, e.what());
    return 1;
  }
  return 0;
}
