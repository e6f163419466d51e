// partition_layers and make_parallel_mlp: which Linears a pipeline stage holds, and
// the stage built with tensor-parallel Linears from make_mlp's draws.
#include "ddp/model_parallel.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "ddp/random.hpp"
#include "ddp/tensor_parallel.hpp"
#include "ddp/types.hpp"
#include "model_parallel_layout.hpp"

namespace ddp {
namespace {

void check_sizes(const std::vector<size_t>& sizes, const char* who) {
  if (sizes.size() < 2) throw InvalidArgument(std::string(who) + ": needs at least an input and an output size");
  for (size_t s : sizes) {
    if (s == 0) throw InvalidArgument(std::string(who) + ": a layer width is 0");
  }
}

// Linear i's parameter count: weight and bias (make_mlp's Linears all have a bias).
uint64_t linear_params(const std::vector<size_t>& sizes, size_t i) {
  return static_cast<uint64_t>(sizes[i]) * sizes[i + 1] + sizes[i + 1];
}

enum class LinearKind { Plain, Column, Row };

// Linear i of `linears` with `tp` ranks: column and row alternate over the whole model;
// a column with no row after it (an odd last Linear) stays plain.
LinearKind kind_of(size_t i, size_t linears, int tp) {
  if (tp == 1) return LinearKind::Plain;
  if (i % 2 == 1) return LinearKind::Row;
  return i + 1 == linears ? LinearKind::Plain : LinearKind::Column;
}

}  // namespace

namespace model_parallel {

bool has_axis(const DeviceMesh& mesh, const std::string& axis) {
  for (const auto& a : mesh.axes()) {
    if (a.name == axis) return true;
  }
  return false;
}

int axis_size(const DeviceMesh& mesh, const std::string& axis) {
  return has_axis(mesh, axis) ? mesh.size(axis) : 1;
}

int axis_coordinate(const DeviceMesh& mesh, const std::string& axis) {
  return has_axis(mesh, axis) ? mesh.coordinate(axis) : 0;
}

}  // namespace model_parallel

std::vector<std::pair<size_t, size_t>> partition_layers(const std::vector<size_t>& sizes, int stages) {
  check_sizes(sizes, "partition_layers");
  const size_t n = sizes.size() - 1;  // Linears
  if (stages < 1 || static_cast<size_t>(stages) > n) {
    throw InvalidArgument("partition_layers: " + std::to_string(stages) + " pipeline stages for " +
                          std::to_string(n) + " Linear layers (each stage needs at least one)");
  }
  const auto k_max = static_cast<size_t>(stages);
  std::vector<uint64_t> prefix(n + 1, 0);  // parameters of Linears [0, j)
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + linear_params(sizes, i);
  // best[k][j]: the least largest stage over splits of Linears [0, j) into k stages.
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  std::vector<std::vector<uint64_t>> best(k_max + 1, std::vector<uint64_t>(n + 1, kNone));
  for (size_t j = 1; j <= n; ++j) best[1][j] = prefix[j];
  for (size_t k = 2; k <= k_max; ++k) {
    for (size_t j = k; j <= n; ++j) {
      for (size_t i = k - 1; i < j; ++i) best[k][j] = std::min(best[k][j], std::max(best[k - 1][i], prefix[j] - prefix[i]));
    }
  }
  // Walk back from the last stage, each boundary the earliest that keeps the optimum.
  std::vector<std::pair<size_t, size_t>> ranges(k_max);
  size_t end = n;
  for (size_t k = k_max; k >= 2; --k) {
    size_t i = k - 1;
    while (std::max(best[k - 1][i], prefix[end] - prefix[i]) > best[k][end]) ++i;
    ranges[k - 1] = {i, end};
    end = i;
  }
  ranges[0] = {0, end};
  return ranges;
}

MlpStage make_parallel_mlp(const MlpOptions& options, const DeviceMesh& mesh) {
  const auto& sizes = options.sizes;
  check_sizes(sizes, "make_parallel_mlp");
  const size_t linears = sizes.size() - 1;
  const int pp = model_parallel::axis_size(mesh, "pp");
  const int tp = model_parallel::axis_size(mesh, "tp");
  if (static_cast<size_t>(pp) > linears) {
    throw InvalidArgument("make_parallel_mlp: --pp " + std::to_string(pp) + " needs at least " + std::to_string(pp) +
                          " Linear layers, the model has " + std::to_string(linears));
  }
  // Every rank checks the whole model, so that all of them refuse a layout alike.
  for (size_t i = 0; i < linears; ++i) {
    const LinearKind kind = kind_of(i, linears, tp);
    if (kind == LinearKind::Plain) continue;
    const size_t width = kind == LinearKind::Column ? sizes[i + 1] : sizes[i];
    if (width % static_cast<size_t>(tp) != 0) {
      throw InvalidArgument("make_parallel_mlp: width " + std::to_string(width) + " (Linear " + std::to_string(i) +
                            ": " + std::to_string(sizes[i]) + " -> " + std::to_string(sizes[i + 1]) +
                            ") does not divide by --tp " + std::to_string(tp));
    }
  }
  const auto [first, end] = partition_layers(sizes, pp)[static_cast<size_t>(model_parallel::axis_coordinate(mesh, "pp"))];

  MlpStage stage;
  stage.first_linear = first;
  stage.end_linear = end;
  stage.model = std::make_unique<Sequential>();
  Rng rng(options.seed);
  // Linear draws weight then bias, one engine value each: skip the earlier stages'.
  for (size_t i = 0; i < first; ++i) rng.discard(linear_params(sizes, i));
  for (size_t i = first; i < end; ++i) {
    const LinearOptions full{sizes[i], sizes[i + 1], true};
    const std::string prefix = std::to_string(2 * i) + ".";  // make_mlp's index: Linear, ReLU, ...
    switch (kind_of(i, linears, tp)) {
      case LinearKind::Plain: stage.model->add<Linear>(full, rng, prefix); break;
      case LinearKind::Column: stage.model->add<ColumnParallelLinear>(full, rng, mesh.group("tp"), prefix); break;
      case LinearKind::Row: stage.model->add<RowParallelLinear>(full, rng, mesh.group("tp"), prefix); break;
    }
    if (i + 1 < linears) stage.model->add<ReLU>();
  }
  const auto t = static_cast<size_t>(tp);
  stage.in_features = sizes[first] / (kind_of(first, linears, tp) == LinearKind::Row ? t : 1);
  stage.out_features = sizes[end] / (kind_of(end - 1, linears, tp) == LinearKind::Column ? t : 1);
  return stage;
}

}  // namespace ddp
