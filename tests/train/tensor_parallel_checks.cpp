// tensor_parallel_checks: a program the tensor-parallel tests launch under the real
// ddprun (2 or 4 ranks); it checks the device mesh and the tensor-parallel layers
// against a real process group, on synthetic data:
//
//   - mesh: for several shapes, each axis's coordinate, group ranks (found by a search
//     over every rank's coordinates, not the mesh's own arithmetic), group rank and size,
//     a sum over each group (it adds exactly those ranks), neighbours and describe();
//     the environment's LOCAL_WORLD_SIZE used by default; bad shapes refused;
//   - layers, at every tp size the world allows (2; 2 and 4 at world 4): Column, Row,
//     their gather/scatter variants and Megatron's MLP block (column → ReLU → row)
//     against the unsplit Linear on the same input and dy: output, input gradient and
//     parameter gradients (each a printed max_rel_diff: exactly 0 where the block is a
//     block of the unsplit GEMM — column forward, every dW and db, row dx — else within
//     1e-6, where a sum is split over ranks), and Parameter::split naming the block;
//   - slots: two forwards then their backwards in reverse order equal each alone, run
//     in the backwards' order (bit for bit);
//   - training: a col → ReLU → row → ReLU → Linear model, 20 steps of SGD and of AdamW,
//     against make_mlp on the same batches (largest per-parameter max|a-b|/max|b|);
//   - bad sizes: InvalidArgument, no hang.
//
// Prints "rank R: N checks, F failed" last; exits 0 only when nothing failed.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/device_mesh.hpp"
#include "ddp/init.hpp"
#include "ddp/nn.hpp"
#include "ddp/optim.hpp"
#include "ddp/tensor_parallel.hpp"
#include "launched_checks.hpp"

namespace {

using launched::check;
using launched::g_rank;
using PG = std::shared_ptr<ddp::ProcessGroup>;

constexpr double kBound = 1e-6;  // the largest relative difference from the unsplit model

std::vector<float> values(const ddp::Tensor& t) { return std::vector<float>(t.data(), t.data() + t.size()); }

ddp::Tensor block(const ddp::Tensor& t, size_t row0, size_t col0, size_t rows, size_t cols) {
  ddp::Tensor b(rows, cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) b(r, c) = t(row0 + r, col0 + c);
  return b;
}

// The block of an unsplit parameter's tensor that a split parameter holds.
ddp::Tensor cut(const ddp::Tensor& full, const ddp::ParameterSplit& s) {
  if (s.dim < 0) return full;
  const auto parts = static_cast<size_t>(s.parts), index = static_cast<size_t>(s.index);
  if (s.dim == 0) return block(full, index * full.rows() / parts, 0, full.rows() / parts, full.cols());
  return block(full, 0, index * full.cols() / parts, full.rows(), full.cols() / parts);
}

ddp::Tensor random_tensor(size_t rows, size_t cols, uint64_t seed) {
  ddp::Rng rng(seed);
  ddp::Tensor t(rows, cols);
  for (float& x : t.span()) x = rng.uniform(-1.0f, 1.0f);
  return t;
}

// Prints the difference of `a` from the reference `b` and checks it: 0 when `exact`
// (the same products summed in the same order as the unsplit layer: a block of its
// GEMM), else within the bound (a sum split over ranks and then added).
double compare(const std::string& what, const ddp::Tensor& a, const ddp::Tensor& b, bool exact = false) {
  const double d = launched::rel_diff(values(a), values(b));
  std::printf("rank %d: %s: max_rel_diff %.3g\n", g_rank, what.c_str(), d);
  check(exact ? d == 0 : d <= kBound, what + (exact ? " exact" : " within 1e-6"));
  return d;
}

template <typename F>
bool throws_invalid(F&& f) {
  try {
    f();
  } catch (const ddp::InvalidArgument&) {
    return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// The mesh
// ---------------------------------------------------------------------------

// Every rank's coordinates under `axes`, by counting in mixed radix (last axis fastest).
std::vector<std::vector<int>> all_coordinates(const std::vector<ddp::MeshAxis>& axes, int world) {
  std::vector<std::vector<int>> all;
  std::vector<int> c(axes.size(), 0);
  for (int r = 0; r < world; ++r) {
    all.push_back(c);
    for (size_t i = axes.size(); i-- > 0;) {
      if (++c[i] < axes[i].size) break;
      c[i] = 0;
    }
  }
  return all;
}

void check_mesh(const ddp::DeviceMesh& mesh) {
  const auto& axes = mesh.axes();
  const int world = mesh.world()->size(), me = mesh.world()->rank();
  const auto coords = all_coordinates(axes, world);
  const std::string shape = ddp::mesh_shape_name(axes);
  std::string describe = shape + ": rank " + std::to_string(me) + " at ";
  for (size_t a = 0; a < axes.size(); ++a) {
    const std::string& name = axes[a].name;
    const std::string at = shape + " axis " + name;
    describe += (a == 0 ? "" : ", ") + name + " " + std::to_string(coords[me][a]);
    // The group: every rank that agrees with this one on all other axes, by coordinate.
    std::vector<int> expected(static_cast<size_t>(axes[a].size), -1);
    for (int r = 0; r < world; ++r) {
      bool same = true;
      for (size_t b = 0; b < axes.size(); ++b) same = same && (b == a || coords[r][b] == coords[me][b]);
      if (same) expected[static_cast<size_t>(coords[r][a])] = r;
    }
    check(mesh.coordinate(name) == coords[me][a], at + " coordinate");
    check(mesh.ranks(name) == expected, at + " ranks");
    const PG& g = mesh.group(name);
    check(g && g->size() == axes[a].size && g->rank() == coords[me][a], at + " group size and rank");
    // A sum over the group adds exactly its ranks.
    int64_t bits = int64_t{1} << me, want = 0;
    for (int r : expected) want += int64_t{1} << r;
    g->all_reduce(ddp::view(std::span<int64_t>(&bits, 1)));
    check(bits == want, at + " all_reduce sums the group's ranks");
    const int c = coords[me][a];
    check(mesh.neighbour(name, 1) == (c + 1 < axes[a].size ? expected[static_cast<size_t>(c + 1)] : -1) &&
              mesh.neighbour(name, -1) == (c > 0 ? expected[static_cast<size_t>(c - 1)] : -1),
          at + " neighbours");
  }
  check(mesh.rank_of(coords[me]) == me, shape + " rank_of");
  check(mesh.describe() == describe, shape + " describe: " + mesh.describe());
}

void mesh_checks(const PG& world) {
  const int n = world->size();
  std::vector<std::vector<ddp::MeshAxis>> shapes = {{{"dp", n / 2}, {"tp", 2}}, {{"tp", 2}, {"dp", n / 2}},
                                                    {{"dp", n}, {"tp", 1}}};
  if (n == 4) shapes.push_back({{"pp", 2}, {"dp", 1}, {"tp", 2}});
  for (const auto& axes : shapes) check_mesh(ddp::DeviceMesh(world, axes, {.within_host = {}}));
  check_mesh(ddp::make_model_parallel_mesh(world, 2, 1));
  check_mesh(ddp::make_model_parallel_mesh(world, 1, 2));
  if (n == 4) check_mesh(ddp::make_model_parallel_mesh(world, 2, 2));
  // LOCAL_WORLD_SIZE from the environment is the world here (one host): tp n fits.
  check_mesh(ddp::DeviceMesh(world, {{"tp", n}}));
  // Every rank refuses the same bad shapes before any group is made (nothing hangs).
  check(throws_invalid([&] { ddp::DeviceMesh(world, {{"tp", n}}, {.local_world_size = n / 2}); }),
        "tp over two hosts refused");
  check(throws_invalid([&] { ddp::DeviceMesh(world, {{"dp", n}, {"tp", 2}}); }), "product != world refused");
  check(throws_invalid([&] { ddp::make_model_parallel_mesh(world, 3, 1); }), "tp 3 refused");
}

// ---------------------------------------------------------------------------
// The layers against the unsplit Linear
// ---------------------------------------------------------------------------

constexpr size_t kBatch = 8;

void column_checks(const PG& tp, const std::string& tag) {
  const auto parts = static_cast<size_t>(tp->size()), r = static_cast<size_t>(tp->rank());
  const ddp::LinearOptions full{24, 32, true};
  const size_t out = 32 / parts;
  const ddp::Tensor x = random_tensor(kBatch, 24, 1), dy = random_tensor(kBatch, 32, 2);
  for (bool gather : {false, true}) {
    const std::string at = tag + (gather ? " column gather_output" : " column");
    ddp::Rng r0(3), r1(3);
    ddp::Linear whole(full, r0, "1.");
    ddp::ColumnParallelLinear col(full, r1, tp, "1.", {.gather_output = gather});
    check(values(col.weight().value) == values(cut(whole.weight().value, col.weight().split)) &&
              values(col.bias().value) == values(cut(whole.bias().value, col.bias().split)),
          at + " init is the unsplit layer's block");
    check(col.weight().split.dim == 0 && col.bias().split.dim == 1 && col.weight().split.index == tp->rank() &&
              col.weight().split.parts == tp->size(),
          at + " split");
    const ddp::Tensor& y = whole.forward(x);
    compare(at + " forward", col.forward(x), gather ? y : block(y, 0, r * out, kBatch, out), true);
    const ddp::Tensor dx = whole.backward(dy, {}, true);
    compare(at + " dx", col.backward(gather ? dy : block(dy, 0, r * out, kBatch, out), {}, true), dx);
    compare(at + " dW", col.weight().grad, cut(whole.weight().grad, col.weight().split), true);
    compare(at + " db", col.bias().grad, cut(whole.bias().grad, col.bias().split), true);
  }
}

void row_checks(const PG& tp, const std::string& tag) {
  const auto parts = static_cast<size_t>(tp->size()), r = static_cast<size_t>(tp->rank());
  const ddp::LinearOptions full{32, 24, true};
  const size_t in = 32 / parts, rows = kBatch / parts;
  const ddp::Tensor x = random_tensor(kBatch, 32, 4), dy = random_tensor(kBatch, 24, 5);
  const ddp::Tensor x_shard = block(x, 0, r * in, kBatch, in);
  for (bool scatter : {false, true}) {
    const std::string at = tag + (scatter ? " row scatter_output" : " row");
    ddp::Rng r0(6), r1(6);
    ddp::Linear whole(full, r0, "3.");
    ddp::RowParallelLinear row(full, r1, tp, "3.", {.scatter_output = scatter});
    check(values(row.weight().value) == values(cut(whole.weight().value, row.weight().split)) &&
              values(row.bias().value) == values(whole.bias().value),
          at + " init is the unsplit layer's block");
    check(row.weight().split.dim == 1 && row.bias().split.dim == -1 && row.weight().split.index == tp->rank(),
          at + " split");
    const ddp::Tensor& y = whole.forward(x);
    compare(at + " forward", row.forward(x_shard), scatter ? block(y, r * rows, 0, rows, 24) : y);
    const ddp::Tensor dx = whole.backward(dy, {}, true);
    const ddp::Tensor& dx_shard = row.backward(scatter ? block(dy, r * rows, 0, rows, 24) : dy, {}, true);
    compare(at + " dx", dx_shard, block(dx, 0, r * in, kBatch, in), true);
    compare(at + " dW", row.weight().grad, cut(whole.weight().grad, row.weight().split), true);
    compare(at + " db", row.bias().grad, whole.bias().grad, true);
  }
}

// Megatron's block: 24 → 64 (column) → ReLU → 64 → 24 (row), against two Linears.
struct Block {
  ddp::Sequential tp_model, model;
  Block(const PG& tp, uint64_t seed) {
    ddp::Rng r0(seed), r1(seed);
    model.add<ddp::Linear>(ddp::LinearOptions{24, 64, true}, r0, "0.");
    model.add<ddp::ReLU>();
    model.add<ddp::Linear>(ddp::LinearOptions{64, 24, true}, r0, "2.");
    tp_model.add<ddp::ColumnParallelLinear>(ddp::LinearOptions{24, 64, true}, r1, tp, "0.");
    tp_model.add<ddp::ReLU>();
    tp_model.add<ddp::RowParallelLinear>(ddp::LinearOptions{64, 24, true}, r1, tp, "2.");
  }
};

void compare_grads(const std::string& at, ddp::Module& tp_model, ddp::Module& model) {
  auto tps = tp_model.parameters(), ps = model.parameters();
  check(tps.size() == ps.size(), at + " parameter count");
  for (size_t i = 0; i < tps.size() && i < ps.size(); ++i) {
    check(tps[i]->name == ps[i]->name, at + " parameter names");
    // Exact: the row layer's dx is exact, so is everything below it.
    compare(at + " grad " + ps[i]->name, tps[i]->grad, cut(ps[i]->grad, tps[i]->split), true);
  }
}

void block_checks(const PG& tp, const std::string& tag) {
  Block b(tp, 8);
  const ddp::Tensor x = random_tensor(kBatch, 24, 9), dy = random_tensor(kBatch, 24, 10);
  compare(tag + " mlp block forward", b.tp_model.forward(x), b.model.forward(x));
  compare(tag + " mlp block dx", b.tp_model.backward(dy, {}, true), b.model.backward(dy, {}, true));
  compare_grads(tag + " mlp block", b.tp_model, b.model);
}

// Two forwards in slots 0 and 1, then their backwards in reverse order, equal doing
// each alone (bit for bit: the same operations on the same values).
void slot_checks(const PG& tp, const std::string& tag) {
  Block a(tp, 11), alone(tp, 11);
  const ddp::Tensor x0 = random_tensor(kBatch, 24, 12), x1 = random_tensor(kBatch, 24, 13);
  const ddp::Tensor dy0 = random_tensor(kBatch, 24, 14), dy1 = random_tensor(kBatch, 24, 15);
  // Alone, in the order the slots' backwards run (gradients accumulate in that order).
  const ddp::Tensor y1 = alone.tp_model.forward(x1), dx1 = alone.tp_model.backward(dy1, {}, true);
  const ddp::Tensor y0 = alone.tp_model.forward(x0), dx0 = alone.tp_model.backward(dy0, {}, true);
  a.tp_model.select_slot(0);
  const ddp::Tensor& s0 = a.tp_model.forward(x0);
  a.tp_model.select_slot(1);
  const ddp::Tensor& s1 = a.tp_model.forward(x1);
  check(values(s0) == values(y0) && values(s1) == values(y1), tag + " slots: both outputs kept");
  const ddp::Tensor b1 = a.tp_model.backward(dy1, {}, true);
  a.tp_model.select_slot(0);
  const ddp::Tensor b0 = a.tp_model.backward(dy0, {}, true);
  check(values(b0) == values(dx0) && values(b1) == values(dx1), tag + " slots: input gradients");
  auto pa = a.tp_model.parameters(), pb = alone.tp_model.parameters();
  bool same = true;
  for (size_t i = 0; i < pa.size(); ++i) same = same && values(pa[i]->grad) == values(pb[i]->grad);
  check(same, tag + " slots: parameter gradients");
}

// ---------------------------------------------------------------------------
// Training against make_mlp
// ---------------------------------------------------------------------------

std::unique_ptr<ddp::Optimizer> optimizer(const std::string& kind, std::vector<ddp::Parameter*> p) {
  if (kind == "adamw") return std::make_unique<ddp::AdamW>(std::move(p), ddp::AdamWOptions{.lr = 1e-3f});
  return std::make_unique<ddp::SGD>(std::move(p), ddp::SgdOptions{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f});
}

void training_checks(const PG& tp, const std::string& tag, const std::string& kind) {
  const std::vector<size_t> sizes = {24, 64, 32, 10};
  const uint64_t seed = 21;
  auto model = ddp::make_mlp({.sizes = sizes, .seed = seed});
  ddp::Sequential tp_model;
  ddp::Rng rng(seed);
  tp_model.add<ddp::ColumnParallelLinear>(ddp::LinearOptions{24, 64, true}, rng, tp, "0.");
  tp_model.add<ddp::ReLU>();
  tp_model.add<ddp::RowParallelLinear>(ddp::LinearOptions{64, 32, true}, rng, tp, "2.");
  tp_model.add<ddp::ReLU>();
  tp_model.add<ddp::Linear>(ddp::LinearOptions{32, 10, true}, rng, "4.");
  auto opt = optimizer(kind, model->parameters());
  auto tp_opt = optimizer(kind, tp_model.parameters());
  ddp::Tensor x, dlogits, tp_dlogits;
  std::vector<int32_t> labels;
  for (int step = 0; step < 20; ++step) {
    launched::fill_batch(x, labels, 16, 24, 10, 0, step);  // the same batch on every rank
    model->zero_grad();
    tp_model.zero_grad();
    ddp::softmax_cross_entropy(model->forward(x), labels, dlogits);
    ddp::softmax_cross_entropy(tp_model.forward(x), labels, tp_dlogits);
    model->backward(dlogits);
    tp_model.backward(tp_dlogits);
    opt->step();
    tp_opt->step();
  }
  double worst = 0;
  std::string worst_name;
  auto tps = tp_model.parameters(), ps = model->parameters();
  for (size_t i = 0; i < ps.size(); ++i) {
    const double d = launched::rel_diff(values(tps[i]->value), values(cut(ps[i]->value, tps[i]->split)));
    if (d >= worst) worst = d, worst_name = ps[i]->name;
  }
  const std::string at = tag + " 20 steps " + kind + " vs make_mlp (worst " + worst_name + ")";
  std::printf("rank %d: %s: max_rel_diff %.3g\n", g_rank, at.c_str(), worst);
  check(worst <= kBound, at + " within 1e-6");
  // The replicated last layer stays the same on every rank of the group.
  auto& last = dynamic_cast<ddp::Linear&>(tp_model[4]);
  check(launched::same_everywhere(*tp, launched::hash_floats(values(last.weight().value))),
        at + " replicated layer equal across tp");
}

void bad_sizes(const PG& tp, const std::string& tag) {
  ddp::Rng rng(1);
  const size_t odd = static_cast<size_t>(tp->size()) * 8 + 1;
  check(throws_invalid([&] { ddp::ColumnParallelLinear({8, odd, true}, rng, tp); }), tag + " column out refused");
  check(throws_invalid([&] { ddp::RowParallelLinear({odd, 8, true}, rng, tp); }), tag + " row in refused");
  ddp::RowParallelLinear row({8 * static_cast<size_t>(tp->size()), 4, true}, rng, tp, "", {.scatter_output = true});
  check(throws_invalid([&] { row.forward(ddp::Tensor(odd, 8)); }), tag + " scatter of an odd batch refused");
  check(throws_invalid([&] { row.forward(ddp::Tensor(4, 9)); }), tag + " row input of the wrong width refused");
  // The layers still work after refusing (no collective was started).
  const ddp::Tensor& y = row.forward(ddp::Tensor(static_cast<size_t>(tp->size()), 8));
  check(y.rows() == 1 && y.cols() == 4, tag + " usable after the refusals");
}

}  // namespace

int main() {
  try {
    auto world = ddp::init({.backend = "cpu"});
    g_rank = world->rank();
    mesh_checks(world);
    std::vector<int> tps = {2};
    if (world->size() == 4) tps.push_back(4);
    for (int tp_size : tps) {
      const ddp::DeviceMesh mesh = ddp::make_model_parallel_mesh(world, tp_size, 1);
      const PG& tp = mesh.group("tp");
      const std::string tag = "tp " + std::to_string(tp_size);
      column_checks(tp, tag);
      row_checks(tp, tag);
      block_checks(tp, tag);
      slot_checks(tp, tag);
      for (const char* kind : {"sgd", "adamw"}) training_checks(tp, tag, kind);
      bad_sizes(tp, tag);
    }
    world->barrier();
  } catch (const std::exception& e) {
    std::printf("rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
  return launched::finish();
}
