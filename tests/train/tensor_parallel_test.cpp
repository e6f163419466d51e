// The device mesh and the tensor-parallel layers in one process: mesh shapes checked
// without any group (check_mesh_shape), a mesh built over a recording stand-in group
// seen from one rank of a larger world (layout, groups made, neighbours), and the layers
// at a rank of a larger tp group (their block of the unsplit init, Parameter::split,
// bad sizes) and alone (tp of one rank: exactly Linear). The collectives at 2 and 4
// ranks are tensor_parallel_checks'.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/device_mesh.hpp"
#include "ddp/nn.hpp"
#include "ddp/random.hpp"
#include "ddp/tensor_parallel.hpp"
#include "recording_backend.hpp"

namespace {

using ddp::MeshAxis;

// Rank `rank` of a world of `size` whose collectives do nothing; with one rank, the
// gathers and reduce-scatters are copies (what a group of one does).
std::shared_ptr<ddp::ProcessGroup> stand_in(int rank, int size,
                                            std::shared_ptr<testing::RecordingBackend::Calls>* calls = nullptr) {
  return testing::recording_group("stand-in", rank, size, ddp::detail::Reach::Host, calls,
                                  [](const ddp::detail::Op& op, const ddp::detail::Backend&) {
    using ddp::detail::OpKind;
    const bool copies = op.kind == OpKind::AllGather || op.kind == OpKind::ReduceScatter;
    if (copies && op.input.data != op.output.data) {
      std::memmove(op.output.data, op.input.data, op.output.bytes());
    }
    return ddp::Work();
  });
}

std::string shape_error(const std::vector<MeshAxis>& axes, int world, int local,
                        const std::vector<std::string>& within = {"tp"}) {
  try {
    ddp::check_mesh_shape(axes, world, local, within);
  } catch (const ddp::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

ddp::Tensor random_tensor(size_t rows, size_t cols, uint64_t seed) {
  ddp::Rng rng(seed);
  ddp::Tensor t(rows, cols);
  for (float& x : t.span()) x = rng.uniform(-1.0f, 1.0f);
  return t;
}

bool same_values(const ddp::Tensor& a, const ddp::Tensor& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The block of `t` with `rows` × `cols` at (row0, col0).
ddp::Tensor block(const ddp::Tensor& t, size_t row0, size_t col0, size_t rows, size_t cols) {
  ddp::Tensor b(rows, cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) b(r, c) = t(row0 + r, col0 + c);
  return b;
}

}  // namespace

TEST_CASE("mesh shapes: good ones pass, each bad one is one InvalidArgument naming shape and world", "[mesh]") {
  CHECK(shape_error({{"pp", 2}, {"dp", 2}, {"tp", 2}}, 8, 8).empty());
  CHECK(shape_error({{"dp", 4}, {"tp", 2}}, 8, 2).empty());  // tp inside hosts of 2
  CHECK(shape_error({{"tp", 1}}, 1, 1).empty());
  CHECK(shape_error({{"dp", 3}, {"tp", 1}}, 3, 2).empty());  // a tp of one never spans hosts

  const std::string product = shape_error({{"pp", 2}, {"dp", 2}, {"tp", 2}}, 4, 4);
  CHECK(product.find("pp 2 x dp 2 x tp 2") != std::string::npos);
  CHECK(product.find("world of 4") != std::string::npos);
  CHECK(product.find("product") != std::string::npos);
  CHECK(shape_error({{"dp", 0}, {"tp", 2}}, 0, 1).find("world must have") != std::string::npos);
  CHECK(shape_error({{"dp", 4}, {"tp", 0}}, 4, 4).find("'tp' has size 0") != std::string::npos);
  CHECK(shape_error({{"dp", 2}, {"dp", 2}}, 4, 4).find("'dp' appears twice") != std::string::npos);
  CHECK(shape_error({{"", 2}}, 2, 2).find("no name") != std::string::npos);
  CHECK(shape_error({}, 2, 2).find("no axes") != std::string::npos);
  CHECK(shape_error({{"tp", 2}}, 2, 0).find("local world size 0") != std::string::npos);

  // tp 4 on hosts of 2 ranks: its groups would span two hosts.
  const std::string split = shape_error({{"dp", 2}, {"tp", 4}}, 8, 2);
  CHECK(split.find("dp 2 x tp 4 over a world of 8") != std::string::npos);
  CHECK(split.find("axis 'tp' (size 4)") != std::string::npos);
  CHECK(split.find("LOCAL_WORLD_SIZE 2") != std::string::npos);
  CHECK(split.find("put tp last / make tp divide LOCAL_WORLD_SIZE") != std::string::npos);
  // tp outermost: its group {0, 2} crosses hosts {0, 1} and {2, 3}.
  CHECK(shape_error({{"tp", 2}, {"dp", 2}}, 4, 2).find("ranks 0..2 spans hosts") != std::string::npos);
  // The same shapes are fine when tp need not stay within a host, or hosts are large.
  CHECK(shape_error({{"tp", 2}, {"dp", 2}}, 4, 2, {}).empty());
  CHECK(shape_error({{"tp", 2}, {"dp", 2}}, 4, 4).empty());
  // Several within-host axes are each checked; an axis not in the mesh is ignored.
  CHECK(shape_error({{"ep", 2}, {"tp", 2}}, 4, 2, {"tp", "ep", "cp"}).find("'ep'") != std::string::npos);
  // A world that is not a multiple of the local size: hosts of 3 over 4 ranks.
  CHECK(shape_error({{"dp", 2}, {"tp", 2}}, 4, 3).find("ranks 2..3 spans hosts") != std::string::npos);
}

TEST_CASE("a mesh seen from rank 5 of 8: row-major coordinates, one group per axis, neighbours", "[mesh]") {
  std::shared_ptr<testing::RecordingBackend::Calls> calls;
  ddp::DeviceMesh mesh(stand_in(5, 8, &calls), {{"pp", 2}, {"dp", 2}, {"tp", 2}}, {.local_world_size = 8});
  CHECK(mesh.coordinate("pp") == 1);
  CHECK(mesh.coordinate("dp") == 0);
  CHECK(mesh.coordinate("tp") == 1);
  CHECK(mesh.size("dp") == 2);
  CHECK(mesh.ranks("tp") == std::vector<int>{4, 5});
  CHECK(mesh.ranks("dp") == std::vector<int>{5, 7});
  CHECK(mesh.ranks("pp") == std::vector<int>{1, 5});
  CHECK(mesh.group("tp")->size() == 2);
  CHECK(mesh.group("tp")->rank() == 1);
  CHECK(mesh.group("pp")->rank() == 1);
  CHECK(mesh.group("dp")->rank() == 0);
  // Every rank makes all 4 groups of each of the 3 axes (the new_group contract).
  CHECK(std::count(calls->begin(), calls->end(), "new_group") == 12);
  CHECK(mesh.neighbour("pp", -1) == 1);
  CHECK(mesh.neighbour("pp", 1) == -1);
  CHECK(mesh.neighbour("dp", 1) == 7);
  CHECK(mesh.neighbour("tp", -1) == 4);
  CHECK(mesh.neighbour("tp", 0) == 5);
  CHECK(mesh.rank_of({1, 1, 0}) == 6);
  CHECK(mesh.describe() == "pp 2 x dp 2 x tp 2: rank 5 at pp 1, dp 0, tp 1");
  CHECK_THROWS_AS(mesh.rank_of({1, 2, 0}), ddp::InvalidArgument);
  CHECK_THROWS_AS(mesh.rank_of({1, 1}), ddp::InvalidArgument);
  CHECK_THROWS_WITH(mesh.group("ep"), Catch::Contains("no axis 'ep'"));
  CHECK_THROWS_AS(mesh.coordinate("ep"), ddp::InvalidArgument);
}

TEST_CASE("make_model_parallel_mesh: pp x dp x tp, axes of one rank give groups of one", "[mesh]") {
  ddp::DeviceMesh mesh = ddp::make_model_parallel_mesh(stand_in(3, 4), 2, 1, {.local_world_size = 4});
  CHECK(mesh.describe() == "pp 1 x dp 2 x tp 2: rank 3 at pp 0, dp 1, tp 1");
  CHECK(mesh.group("pp")->size() == 1);
  CHECK(mesh.ranks("pp") == std::vector<int>{3});
  CHECK(mesh.neighbour("pp", 1) == -1);
  CHECK(mesh.ranks("dp") == std::vector<int>{1, 3});
  CHECK_THROWS_WITH(ddp::make_model_parallel_mesh(stand_in(0, 4), 3, 1), Catch::Contains("world of 4"));
  CHECK_THROWS_AS(ddp::make_model_parallel_mesh(stand_in(0, 4), 0, 1), ddp::InvalidArgument);
  // tp 4 over hosts of 2 ranks: refused before any group is made.
  std::shared_ptr<testing::RecordingBackend::Calls> calls;
  CHECK_THROWS_WITH(ddp::make_model_parallel_mesh(stand_in(0, 4, &calls), 4, 1, {.local_world_size = 2}),
                    Catch::Contains("axis 'tp' (size 4)"));
  CHECK(calls->empty());
}

TEST_CASE("tensor-parallel layers keep their block of the unsplit Linear's init and say where it sits", "[tp]") {
  const ddp::LinearOptions full{12, 8, true};
  ddp::Rng reference_rng(11);
  ddp::Linear whole(full, reference_rng, "3.");
  const float after = reference_rng.uniform01();  // the draw after the layer's
  for (int rank = 0; rank < 4; ++rank) {
    ddp::Rng rng(11);
    ddp::ColumnParallelLinear col(full, rng, stand_in(rank, 4), "3.");
    CHECK(rng.uniform01() == after);  // the same draws consumed
    CHECK(col.weight().name == "3.weight");
    CHECK(col.bias().name == "3.bias");
    CHECK(same_values(col.weight().value, block(whole.weight().value, 2 * rank, 0, 2, 12)));
    CHECK(same_values(col.bias().value, block(whole.bias().value, 0, 2 * rank, 1, 2)));
    CHECK(col.weight().split.dim == 0);
    CHECK(col.bias().split.dim == 1);
    CHECK(col.weight().split.parts == 4);
    CHECK(col.weight().split.index == rank);
    CHECK(col.weight().split.full_rows == 8);
    CHECK(col.weight().split.full_cols == 12);

    ddp::Rng rng2(11);
    ddp::RowParallelLinear row(full, rng2, stand_in(rank, 4), "3.");
    CHECK(rng2.uniform01() == after);
    CHECK(same_values(row.weight().value, block(whole.weight().value, 0, 3 * rank, 8, 3)));
    CHECK(same_values(row.bias().value, whole.bias().value));
    CHECK(row.weight().split.dim == 1);
    CHECK(row.weight().split.index == rank);
    CHECK(row.bias().split.dim == -1);
  }
  ddp::Rng rng(1);
  CHECK_THROWS_WITH(ddp::ColumnParallelLinear(ddp::LinearOptions{12, 10, true}, rng, stand_in(0, 4)),
                    Catch::Contains("out_features 10 does not divide by the tp group's 4 ranks"));
  CHECK_THROWS_WITH(ddp::RowParallelLinear(ddp::LinearOptions{10, 8, true}, rng, stand_in(0, 4)),
                    Catch::Contains("in_features 10 does not divide"));
  CHECK_THROWS_AS(ddp::RowParallelLinear(full, rng, nullptr), ddp::InvalidArgument);
}

TEST_CASE("a tp group of one rank: both layers compute exactly what Linear computes", "[tp]") {
  for (bool variant : {false, true}) {
    const ddp::LinearOptions full{12, 8, true};
    ddp::Rng r0(5), r1(5), r2(5);
    ddp::Linear lin(full, r0);
    ddp::ColumnParallelLinear col(full, r1, stand_in(0, 1), "", {.gather_output = variant});
    ddp::RowParallelLinear row(full, r2, stand_in(0, 1), "", {.scatter_output = variant});
    const ddp::Tensor x = random_tensor(6, 12, 9), dy = random_tensor(6, 8, 10);
    const ddp::Tensor y = lin.forward(x);
    CHECK(same_values(col.forward(x), y));
    const ddp::Tensor y_row = row.forward(x);
    // Row adds the bias after the product (one rounding either way: the same values).
    CHECK(same_values(y_row, y));
    const ddp::Tensor dx = lin.backward(dy, {}, true);
    std::vector<std::string> hooked;
    const ddp::GradReadyHook hook = [&](ddp::Parameter& p) { hooked.push_back(p.name); };
    CHECK(same_values(col.backward(dy, hook, true), dx));
    CHECK(same_values(row.backward(dy, {}, true), dx));
    CHECK(hooked == std::vector<std::string>{"bias", "weight"});
    for (auto* layer : std::vector<ddp::Module*>{&col, &row}) {
      CHECK(same_values(layer->parameters()[0]->grad, lin.weight().grad));
      CHECK(same_values(layer->parameters()[1]->grad, lin.bias().grad));
    }
    CHECK(col.backward(dy, {}, false).empty());
  }
}

TEST_CASE("tensor-parallel layers refuse wrong shapes and backward before forward", "[tp]") {
  ddp::Rng rng(3);
  ddp::ColumnParallelLinear col({12, 8, true}, rng, stand_in(0, 1));
  ddp::RowParallelLinear row({12, 8, true}, rng, stand_in(0, 1));
  CHECK_THROWS_WITH(col.backward(ddp::Tensor(2, 8), {}, true), Catch::Contains("before forward"));
  CHECK_THROWS_WITH(row.backward(ddp::Tensor(2, 8), {}, true), Catch::Contains("before forward"));
  CHECK_THROWS_WITH(col.forward(ddp::Tensor(2, 11)), Catch::Contains("input is 2x11"));
  CHECK_THROWS_WITH(row.forward(ddp::Tensor(2, 11)), Catch::Contains("input is 2x11"));
  const ddp::Tensor x(2, 12);
  col.forward(x);
  row.forward(x);
  CHECK_THROWS_WITH(col.backward(ddp::Tensor(2, 7), {}, true), Catch::Contains("dy is 2x7, expected 2x8"));
  CHECK_THROWS_WITH(row.backward(ddp::Tensor(3, 8), {}, true), Catch::Contains("dy is 3x8, expected 2x8"));
}
