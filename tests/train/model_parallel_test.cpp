// The model-parallel builder and its checkpoints in one process: partition_layers
// against every contiguous split, make_parallel_mlp on a mesh of one rank (exactly
// make_mlp), and checkpoints through a mesh of one (exactly save_checkpoint's file, and
// loaded back, with refusals that change nothing). Layouts of several ranks are
// layout_checks' (launched under ddprun).
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/checkpoint.hpp"
#include "ddp/device_mesh.hpp"
#include "ddp/model_parallel.hpp"
#include "ddp/optim.hpp"
#include "recording_backend.hpp"
#include "subprocess.hpp"

namespace {

using Ranges = std::vector<std::pair<size_t, size_t>>;

uint64_t params_of(const std::vector<size_t>& sizes, size_t first, size_t end) {
  uint64_t n = 0;
  for (size_t i = first; i < end; ++i) n += sizes[i] * sizes[i + 1] + sizes[i + 1];
  return n;
}

uint64_t largest_stage(const std::vector<size_t>& sizes, const Ranges& ranges) {
  uint64_t most = 0;
  for (auto [first, end] : ranges) most = std::max(most, params_of(sizes, first, end));
  return most;
}

// The least largest stage over every way to cut `linears` Linears into `stages`
// non-empty contiguous ranges (boundaries chosen by recursion).
uint64_t brute_force(const std::vector<size_t>& sizes, size_t first, int stages) {
  const size_t linears = sizes.size() - 1;
  if (stages == 1) return params_of(sizes, first, linears);
  uint64_t best = UINT64_MAX;
  for (size_t end = first + 1; end + static_cast<size_t>(stages - 1) <= linears; ++end) {
    best = std::min(best, std::max(params_of(sizes, first, end), brute_force(sizes, end, stages - 1)));
  }
  return best;
}

// A mesh of one rank over a group that may not run collectives (it records them).
struct SoloMesh {
  std::shared_ptr<testing::RecordingBackend::Calls> calls;
  ddp::DeviceMesh mesh;
  SoloMesh()
      : mesh(testing::recording_group("solo", 0, 1, ddp::detail::Reach::Host, &calls),
             {{"pp", 1}, {"dp", 1}, {"tp", 1}}, {.local_world_size = 1}) {}
  size_t collectives() const {
    size_t n = 0;
    for (const auto& c : *calls) n += c != "new_group" ? 1 : 0;
    return n;
  }
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A few steps of `opt` on random gradients, so its state is not trivial.
void step(ddp::Module& model, ddp::Optimizer& opt, int steps) {
  ddp::Rng rng(7);
  for (int s = 0; s < steps; ++s) {
    for (auto* p : model.parameters())
      for (float& g : p->grad.span()) g = rng.uniform(-1, 1);
    opt.step();
  }
}

std::vector<float> values(ddp::Module& m) {
  std::vector<float> v;
  for (auto* p : m.parameters()) v.insert(v.end(), p->value.span().begin(), p->value.span().end());
  return v;
}

}  // namespace

TEST_CASE("partition_layers: contiguous stages whose largest is the least possible", "[model_parallel]") {
  const std::vector<size_t> wide = {784, 2048, 2048, 2048, 10};
  CHECK(ddp::partition_layers(wide, 1) == Ranges{{0, 4}});
  CHECK(ddp::partition_layers(wide, 2) == Ranges{{0, 2}, {2, 4}});
  CHECK(ddp::partition_layers(wide, 4) == Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
  // Equal Linears, a tie: the later boundary falls as early as it can.
  CHECK(ddp::partition_layers({32, 32, 32, 32}, 2) == Ranges{{0, 1}, {1, 3}});

  ddp::Rng rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> sizes(2 + rng.below(7));
    for (auto& s : sizes) s = 1 + rng.below(64);
    const size_t linears = sizes.size() - 1;
    for (int stages = 1; stages <= static_cast<int>(linears); ++stages) {
      const Ranges r = ddp::partition_layers(sizes, stages);
      REQUIRE(r.size() == static_cast<size_t>(stages));
      CHECK(r.front().first == 0);
      CHECK(r.back().second == linears);
      for (size_t s = 0; s < r.size(); ++s) {
        CHECK(r[s].first < r[s].second);
        if (s > 0) CHECK(r[s].first == r[s - 1].second);
      }
      CHECK(largest_stage(sizes, r) == brute_force(sizes, 0, stages));
    }
  }
}

TEST_CASE("partition_layers refuses stages it cannot fill", "[model_parallel]") {
  CHECK_THROWS_AS(ddp::partition_layers({8, 4, 2}, 3), ddp::InvalidArgument);
  CHECK_THROWS_WITH(ddp::partition_layers({8, 4, 2}, 3), Catch::Contains("3 pipeline stages for 2 Linear"));
  CHECK_THROWS_AS(ddp::partition_layers({8, 4, 2}, 0), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::partition_layers({8}, 1), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::partition_layers({8, 0, 2}, 1), ddp::InvalidArgument);
}

TEST_CASE("Rng::discard(n) skips exactly n draws", "[model_parallel]") {
  for (uint64_t n : {0ull, 1ull, 311ull, 312ull, 313ull, 100000ull}) {
    ddp::Rng drawn(11), skipped(11);
    for (uint64_t i = 0; i < n; ++i) drawn.next();
    skipped.discard(n);
    CHECK(drawn.next() == skipped.next());
  }
}

TEST_CASE("make_parallel_mlp on a mesh of one rank is make_mlp", "[model_parallel]") {
  SoloMesh solo;
  for (const std::vector<size_t>& sizes : {std::vector<size_t>{13, 37, 29, 5}, std::vector<size_t>{6, 3}}) {
    const ddp::MlpOptions options{.sizes = sizes, .seed = 42};
    ddp::MlpStage stage = ddp::make_parallel_mlp(options, solo.mesh);
    auto plain = ddp::make_mlp(options);
    CHECK(stage.first_linear == 0);
    CHECK(stage.end_linear == sizes.size() - 1);
    CHECK(stage.in_features == sizes.front());
    CHECK(stage.out_features == sizes.back());
    REQUIRE(stage.model->size() == plain->size());
    const auto a = stage.model->parameters(), b = plain->parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i]->name == b[i]->name);
      CHECK(a[i]->split.dim == -1);
    }
    CHECK(values(*stage.model) == values(*plain));
  }
  CHECK(solo.collectives() == 0);
}

TEST_CASE("a model-parallel checkpoint through a mesh of one is save_checkpoint's file, and loads back",
          "[model_parallel][checkpoint]") {
  SoloMesh solo;
  testing::TempDir dir;
  const ddp::MlpOptions options{.sizes = {13, 37, 29, 5}, .seed = 9};
  const ddp::CheckpointInfo info{.epoch = 3, .step = 17, .run_id = "layout"};
  ddp::MlpStage stage = ddp::make_parallel_mlp(options, solo.mesh);
  const auto params = stage.model->parameters();

  SECTION("AdamW after steps, SGD before its first momentum step, and no optimizer") {
    ddp::AdamW adamw(params, {.lr = 1e-2f});
    step(*stage.model, adamw, 3);
    ddp::SGD sgd(params, {.lr = 0.1f, .momentum = 0.9f});  // momentum buffers absent
    const ddp::Optimizer* optimizers[] = {&adamw, &sgd, nullptr};
    for (const ddp::Optimizer* opt : optimizers) {
      const std::string split = (dir / "split.ckpt").string(), plain = (dir / "plain.ckpt").string();
      const ddp::OptimizerState state = opt != nullptr ? opt->state() : ddp::OptimizerState{};
      ddp::save_model_parallel_checkpoint(split, params, opt != nullptr ? &state : nullptr, solo.mesh, info);
      ddp::save_checkpoint(plain, *stage.model, opt, info);
      CHECK(read(split) == read(plain));
    }
    CHECK(solo.collectives() == 0);
  }

  SECTION("loading cuts the (whole) blocks and the optimizer state back out") {
    ddp::AdamW adamw(params, {.lr = 1e-2f});
    step(*stage.model, adamw, 2);
    const std::string path = (dir / "a.ckpt").string();
    ddp::save_checkpoint(path, *stage.model, &adamw, info);
    const std::vector<float> saved = values(*stage.model);
    std::ostringstream saved_state;
    adamw.save_state(saved_state);

    ddp::MlpStage other = ddp::make_parallel_mlp({.sizes = options.sizes, .seed = 1}, solo.mesh);
    ddp::OptimizerState state{"adamw", 0, {}};
    const auto got = ddp::load_model_parallel_checkpoint(read(path), path, other.model->parameters(), &state, solo.mesh);
    CHECK(got.epoch == 3);
    CHECK(got.step == 17);
    CHECK(got.run_id == "layout");
    CHECK(values(*other.model) == saved);
    ddp::AdamW fresh(other.model->parameters(), {.lr = 1e-2f});
    fresh.set_state(state);
    std::ostringstream loaded_state;
    fresh.save_state(loaded_state);
    CHECK(loaded_state.str() == saved_state.str());

    // Refusals name the file and change nothing.
    const std::vector<float> before = values(*other.model);
    std::string corrupt = read(path);
    corrupt[corrupt.size() / 2] ^= 0x5a;
    CHECK_THROWS_WITH(ddp::load_model_parallel_checkpoint(corrupt, path, other.model->parameters(), &state, solo.mesh),
                      Catch::Contains(path) && Catch::Contains("checksum"));
    ddp::OptimizerState sgd_state{"sgd", 0, {}};
    CHECK_THROWS_WITH(ddp::load_model_parallel_checkpoint(read(path), path, other.model->parameters(), &sgd_state,
                                                          solo.mesh),
                      Catch::Contains(path) && Catch::Contains("adamw"));
    CHECK(sgd_state.buffers.empty());
    ddp::MlpStage wider = ddp::make_parallel_mlp({.sizes = {13, 38, 29, 5}}, solo.mesh);
    const std::vector<float> wider_before = values(*wider.model);
    CHECK_THROWS_WITH(ddp::load_model_parallel_checkpoint(read(path), path, wider.model->parameters(), nullptr,
                                                          solo.mesh),
                      Catch::Contains(path) && Catch::Contains("0.weight"));
    CHECK(values(*wider.model) == wider_before);
    ddp::Sequential renamed;
    ddp::Rng rng(1);
    renamed.add<ddp::Linear>(ddp::LinearOptions{13, 37}, rng, "layer.");
    CHECK_THROWS_WITH(ddp::load_model_parallel_checkpoint(read(path), path, renamed.parameters(), nullptr, solo.mesh),
                      Catch::Contains(path) && Catch::Contains("no parameter 'layer.weight'"));
    CHECK(values(*other.model) == before);
  }
}
