// What the programs that tests launch under the real ddprun share (ddp_checks,
// sharded_checks, fsdp_checks): counted checks that print what failed, a hash of a
// model's values and whether every rank holds the same one, the relative difference of
// two models' values, and synthetic per-rank batches. Each program ends with finish(),
// whose last line the Catch2 wrappers read.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "ddp/nn.hpp"
#include "ddp/process_group.hpp"
#include "ddp/random.hpp"

namespace launched {

inline int g_checks = 0, g_failures = 0, g_rank = 0;

inline void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("rank %d: FAILED %s\n", g_rank, what.c_str());
  }
}

// "rank R: N checks, F failed", the line the wrappers match; the exit status.
inline int finish() {
  std::printf("rank %d: %d checks, %d failed\n", g_rank, g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

inline constexpr uint64_t kFnvOffset = 1469598103934665603ull;

// FNV-1a over `n` floats' bytes, continuing from `h`.
inline uint64_t hash_floats(const float* v, size_t n, uint64_t h = kFnvOffset) {
  const auto* b = reinterpret_cast<const unsigned char*>(v);
  for (size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
inline uint64_t hash_floats(const std::vector<float>& v) { return hash_floats(v.data(), v.size()); }

// FNV-1a over the bytes of every parameter value (materialized ones).
inline uint64_t hash_params(ddp::Module& m) {
  uint64_t h = kFnvOffset;
  for (auto* p : m.parameters()) h = hash_floats(p->value.data(), p->value.size(), h);
  return h;
}

// max |a - b| / max(max |b|, 1e-12): the difference relative to the values' scale
// (infinite when the sizes differ or there is nothing to compare).
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// Whether every rank of pg holds the same 64-bit value.
inline bool same_everywhere(ddp::ProcessGroup& pg, uint64_t v) {
  std::vector<int64_t> all(static_cast<size_t>(pg.size()));
  int64_t mine = static_cast<int64_t>(v);
  pg.all_gather(ddp::view(std::span<int64_t>(&mine, 1)), ddp::view(all));
  for (int64_t x : all)
    if (x != mine) return false;
  return true;
}

// A batch that differs per `rank` and `step`: values in [-1, 1), labels below `classes`.
inline void fill_batch(ddp::Tensor& x, std::vector<int32_t>& y, size_t batch, size_t features, size_t classes, int rank,
                       int step) {
  x.resize(batch, features);
  y.resize(batch);
  ddp::Rng rng(static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(step));
  for (float& v : x.span()) v = rng.uniform(-1.0f, 1.0f);
  for (auto& label : y) label = static_cast<int32_t>(rng.below(classes));
}

// Every parameter value of `m`, flattened in parameters() order.
inline std::vector<float> values_of(ddp::Module& m) {
  std::vector<float> v;
  for (auto* p : m.parameters()) v.insert(v.end(), p->value.data(), p->value.data() + p->value.size());
  return v;
}

}  // namespace launched
