// layout_checks: a program the layout tests launch under the real ddprun at 4 ranks; it
// checks make_parallel_mlp and the checkpoints across layouts in each of the layouts
// tp4, pp4, pp2 x tp2, dp2 x tp2 and dp2 x pp2 (mesh pp x dp x tp):
//
//   - building: every rank's parameters are make_mlp's, named alike, with values exactly
//     the blocks its Parameter::split names (cut here from make_mlp's own model); the
//     stage's widths are its first and last Linear's; widths that do not divide by tp and
//     more stages than Linears are refused naming them;
//   - memory: over the ranks at dp 0 (one per stage and tp rank) the parameter values and
//     grads add up to the unsplit model's plus only the replicated parameters (row
//     Linears' biases, an odd last Linear on every tp rank); the largest rank's share of
//     the unsplit model is printed, for the test model and the wide 784-2048-2048-2048-10;
//   - saving: with values and optimizer state set from the unsplit model's (AdamW; SGD
//     whose momentum does not exist yet), save_model_parallel_checkpoint writes exactly
//     the bytes save_checkpoint writes for the unsplit model (ranks at dp > 0 hold zeros:
//     they do not contribute); a rank whose state does not fit fails the save on every
//     rank, naming the file and the rank;
//   - loading: the file saved by the previous layout loads into this one, every rank
//     getting exactly its blocks of the values and of the optimizer state, and into the
//     plain model with load_checkpoint; a corrupted file and one of another model fail,
//     naming the file, and change nothing.
//
// Prints "rank R: N checks, F failed" last; exits 0 only when nothing failed.
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ddp/checkpoint.hpp"
#include "ddp/device_mesh.hpp"
#include "ddp/init.hpp"
#include "ddp/model_parallel.hpp"
#include "ddp/optim.hpp"
#include "launched_checks.hpp"

namespace {

using launched::check;

// Linear 0 is the largest, so pp 2 cuts after it: a stage boundary between a column and
// a row Linear; five Linears: an odd last one, plain on every tp rank.
const std::vector<size_t> kSizes = {64, 32, 24, 16, 12, 6};
const std::vector<size_t> kWide = {784, 2048, 2048, 2048, 10};
constexpr uint64_t kSeed = 5;

struct Layout {
  const char* name;
  int tp, pp;
};
const Layout kLayouts[] = {{"tp4", 4, 1}, {"pp4", 1, 4}, {"pp2xtp2", 2, 2}, {"dp2xtp2", 2, 1}, {"dp2xpp2", 1, 2}};

// The unsplit model's value of every parameter, and optimizer state, set from its name.
ddp::Tensor full_tensor(const std::string& name, size_t rows, size_t cols, uint64_t salt) {
  ddp::Tensor t(rows, cols);
  uint64_t seed = launched::kFnvOffset;
  for (unsigned char c : name) seed = (seed ^ c) * 1099511628211ull;
  ddp::Rng rng(seed + salt);
  for (float& v : t.span()) v = salt == 3 ? rng.uniform(0.0f, 1.0f) : rng.uniform(-1.0f, 1.0f);
  return t;
}

// The block of `full` that `p` holds, by its split (the test's own reading of it).
ddp::Tensor block_of(const ddp::Tensor& full, const ddp::Parameter& p) {
  ddp::Tensor b(p.rows(), p.cols());
  const size_t r0 = p.split.dim == 0 ? static_cast<size_t>(p.split.index) * p.rows() : 0;
  const size_t c0 = p.split.dim == 1 ? static_cast<size_t>(p.split.index) * p.cols() : 0;
  for (size_t r = 0; r < p.rows(); ++r)
    for (size_t c = 0; c < p.cols(); ++c) b(r, c) = full(r0 + r, c0 + c);
  return b;
}

bool equal(const ddp::Tensor& a, const ddp::Tensor& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Rank 0's verdict, for every rank to check alike.
bool rank0_says(ddp::ProcessGroup& pg, bool ok) {
  int32_t v = ok ? 1 : 0;
  pg.broadcast(ddp::view(std::span<int32_t>(&v, 1)), 0);
  return v == 1;
}

// The unsplit model's full values and optimizer state ("adamw": exp_avg, exp_avg_sq;
// "sgd": no momentum yet), by parameter name.
struct FullState {
  std::string kind;
  int64_t steps = 0;
  std::map<std::string, ddp::Tensor> values;
  std::map<std::string, std::vector<ddp::Tensor>> buffers;  // empty tensor: absent
};

FullState full_state(const std::string& kind) {
  FullState f{kind, kind == "adamw" ? 5 : 0, {}, {}};
  auto plain = ddp::make_mlp({.sizes = kSizes, .seed = kSeed});
  for (auto* p : plain->parameters()) {
    f.values[p->name] = full_tensor(p->name, p->rows(), p->cols(), 1);
    if (kind == "adamw") {
      f.buffers[p->name] = {full_tensor(p->name, p->rows(), p->cols(), 2), full_tensor(p->name, p->rows(), p->cols(), 3)};
    } else {
      f.buffers[p->name] = {ddp::Tensor()};
    }
  }
  return f;
}

// This rank's blocks of the full optimizer state.
ddp::OptimizerState state_blocks(const FullState& f, const std::vector<ddp::Parameter*>& params) {
  ddp::OptimizerState st{f.kind, f.steps, std::vector<std::vector<ddp::Tensor>>(f.kind == "adamw" ? 2 : 1)};
  for (auto* p : params) {
    for (size_t k = 0; k < st.buffers.size(); ++k) {
      const ddp::Tensor& b = f.buffers.at(p->name)[k];
      st.buffers[k].push_back(b.empty() ? ddp::Tensor() : block_of(b, *p));
    }
  }
  return st;
}

// Sets this rank's blocks of the full values (zeros at dp > 0, which must not matter)
// and returns its blocks of the optimizer state.
ddp::OptimizerState set_blocks(const FullState& f, const std::vector<ddp::Parameter*>& params, bool contributes) {
  for (auto* p : params) {
    p->value.copy_from(block_of(f.values.at(p->name), *p));
    if (!contributes) p->value.zero();
  }
  return state_blocks(f, params);
}

// Building: names, values and widths against make_mlp; refusals.
void building(const ddp::DeviceMesh& mesh, const Layout& l) {
  ddp::MlpStage stage = ddp::make_parallel_mlp({.sizes = kSizes, .seed = kSeed}, mesh);
  auto plain = ddp::make_mlp({.sizes = kSizes, .seed = kSeed});
  std::map<std::string, ddp::Parameter*> by_name;
  for (auto* p : plain->parameters()) by_name[p->name] = p;
  const auto params = stage.model->parameters();
  bool values = !params.empty(), names = params.size() == 2 * (stage.end_linear - stage.first_linear);
  for (size_t i = 0; i < params.size() && names; ++i) {
    const size_t linear = stage.first_linear + i / 2;
    names = params[i]->name == std::to_string(2 * linear) + (i % 2 == 0 ? ".weight" : ".bias");
  }
  for (auto* p : params) values &= by_name.count(p->name) == 1 && equal(p->value, block_of(by_name[p->name]->value, *p));
  const std::string at = std::string(l.name) + " (" + mesh.describe() + ")";
  check(names, at + ": the stage's parameters are its Linears', named as make_mlp names them");
  check(values, at + ": every parameter's value is make_mlp's block that its split names");
  check(!params.empty() && stage.in_features == params.front()->cols() &&
            stage.out_features == params[params.size() - 2]->rows(),
        at + ": the stage's widths are its first and last Linear's (" + std::to_string(stage.in_features) + " -> " +
            std::to_string(stage.out_features) + ")");
  if (l.tp > 1) {
    bool refused = false;
    try {
      ddp::make_parallel_mlp({.sizes = {21, 21, 6}}, mesh);
    } catch (const ddp::InvalidArgument& e) {
      refused = std::strstr(e.what(), "width 21") != nullptr &&
                std::strstr(e.what(), ("--tp " + std::to_string(l.tp)).c_str()) != nullptr;
    }
    check(refused, at + ": a width that does not divide by tp is refused naming it and --tp");
  }
  if (l.pp > 2) {
    bool refused = false;
    try {
      ddp::make_parallel_mlp({.sizes = {8, 4, 2}}, mesh);
    } catch (const ddp::InvalidArgument& e) {
      refused = std::strstr(e.what(), "--pp") != nullptr;
    }
    check(refused, at + ": more stages than Linears is refused naming --pp");
  }
}

// The bytes of values and grads this rank holds.
int64_t held_bytes(ddp::Module& m) {
  int64_t n = 0;
  for (auto* p : m.parameters()) n += static_cast<int64_t>((p->value.size() + p->grad.size()) * sizeof(float));
  return n;
}

// What the tp-split model holds beyond the unsplit one over a stage's tp ranks: every
// tp rank but one holds its own copy of a row Linear's bias and of an odd last Linear.
int64_t replicated_extra(const std::vector<size_t>& sizes, int tp) {
  const size_t linears = sizes.size() - 1;
  int64_t extra = 0;
  for (size_t i = 0; i < linears && tp > 1; ++i) {
    const auto out = static_cast<int64_t>(sizes[i + 1]), in = static_cast<int64_t>(sizes[i]);
    if (i % 2 == 1) extra += out;
    if (i % 2 == 0 && i + 1 == linears) extra += out * in + out;
  }
  return extra * (tp - 1) * 2 * static_cast<int64_t>(sizeof(float));  // values and grads
}

void memory(ddp::ProcessGroup& pg, const ddp::DeviceMesh& mesh, const Layout& l, const std::vector<size_t>& sizes) {
  ddp::MlpStage stage = ddp::make_parallel_mlp({.sizes = sizes, .seed = kSeed}, mesh);
  int64_t mine[2] = {held_bytes(*stage.model), mesh.coordinate("dp")};
  std::vector<int64_t> all(2 * static_cast<size_t>(pg.size()));
  pg.all_gather(ddp::view(std::span<int64_t>(mine, 2)), ddp::view(all));
  int64_t dp0_sum = 0, largest = 0;
  for (size_t r = 0; r < all.size(); r += 2) {
    if (all[r + 1] == 0) dp0_sum += all[r];
    largest = std::max(largest, all[r]);
  }
  stage.model.reset();
  const int64_t unsplit = held_bytes(*ddp::make_mlp({.sizes = sizes}));
  std::string shape;
  for (size_t s : sizes) shape += (shape.empty() ? "" : "-") + std::to_string(s);
  const double ratio = static_cast<double>(largest) / static_cast<double>(unsplit);
  const double ideal = 1.0 / (l.tp * l.pp);
  if (pg.rank() == 0) {
    std::printf("rank 0: memory %s %s: largest rank holds %.4f of the unsplit model's parameter+grad bytes "
                "(%lld of %lld); (1/tp)(1/pp) = %.4f, target %.4f: %s\n",
                l.name, shape.c_str(), ratio, static_cast<long long>(largest), static_cast<long long>(unsplit), ideal,
                ideal + 0.05, ratio <= ideal + 0.05 ? "met" : "missed");
  }
  check(dp0_sum == unsplit + replicated_extra(sizes, l.tp),
        std::string(l.name) + " " + shape + ": the stages' and tp ranks' bytes add up to the unsplit model's plus the "
                                            "replicated parameters (" + std::to_string(dp0_sum) + ")");
}

std::string file_of(const std::string& dir, const Layout& l, const std::string& kind) {
  return dir + "/" + l.name + "-" + kind + ".ckpt";
}

void saving(ddp::ProcessGroup& pg, const ddp::DeviceMesh& mesh, const Layout& l, const std::string& dir) {
  const ddp::CheckpointInfo info{.epoch = 2, .step = 11, .run_id = "layouts"};
  const bool contributes = mesh.coordinate("dp") == 0;
  for (const std::string kind : {"adamw", "sgd"}) {
    const FullState f = full_state(kind);
    const std::string plain_path = dir + "/plain-" + kind + ".ckpt";
    if (pg.rank() == 0) {  // the unsplit model in the same state, saved by save_checkpoint
      auto plain = ddp::make_mlp({.sizes = kSizes});
      std::unique_ptr<ddp::Optimizer> opt;
      if (kind == "adamw") opt = std::make_unique<ddp::AdamW>(plain->parameters(), ddp::AdamWOptions{});
      else opt = std::make_unique<ddp::SGD>(plain->parameters(), ddp::SgdOptions{.momentum = 0.9f});
      const ddp::OptimizerState st = set_blocks(f, plain->parameters(), true);
      opt->set_state(st);
      ddp::save_checkpoint(plain_path, *plain, opt.get(), info);
    }
    ddp::MlpStage stage = ddp::make_parallel_mlp({.sizes = kSizes, .seed = 77}, mesh);
    const ddp::OptimizerState st = set_blocks(f, stage.model->parameters(), contributes);
    const std::string path = file_of(dir, l, kind);
    ddp::save_model_parallel_checkpoint(path, stage.model->parameters(), &st, mesh, info);
    const bool same = rank0_says(pg, pg.rank() != 0 || read(path) == read(plain_path));
    if (pg.rank() == 0) std::printf("rank 0: checkpoint %s %s: byte-identical to save_checkpoint's: %s\n", l.name,
                                    kind.c_str(), same ? "yes" : "no");
    check(same, std::string(l.name) + " " + kind + ": the saved file is save_checkpoint's of the unsplit model");
  }
  // A contributing rank whose state does not fit: every rank fails, naming the file and it.
  const FullState f = full_state("adamw");
  ddp::MlpStage stage = ddp::make_parallel_mlp({.sizes = kSizes, .seed = kSeed}, mesh);
  ddp::OptimizerState st = set_blocks(f, stage.model->parameters(), contributes);
  const bool culprit = contributes && mesh.coordinate("pp") == l.pp - 1 && mesh.coordinate("tp") == l.tp - 1;
  if (culprit) st.buffers[0].pop_back();
  const std::string path = dir + "/bad.ckpt";
  std::string why;
  try {
    ddp::save_model_parallel_checkpoint(path, stage.model->parameters(), &st, mesh, info);
  } catch (const ddp::Error& e) {
    why = e.what();
  }
  const int bad_rank = mesh.rank_of({l.pp - 1, 0, l.tp - 1});
  check(why.find(path) != std::string::npos && why.find("rank " + std::to_string(bad_rank)) != std::string::npos &&
            !std::filesystem::exists(path),
        std::string(l.name) + ": a rank's unfitting state fails the save everywhere, naming the file and the rank (" +
            why + ")");
}

void loading(ddp::ProcessGroup& pg, const ddp::DeviceMesh& mesh, const Layout& l, const Layout& saved_by,
             const std::string& dir) {
  const std::string at = std::string(l.name) + " loading " + saved_by.name + "'s file";
  for (const std::string kind : {"adamw", "sgd"}) {
    const FullState f = full_state(kind);
    const std::string path = file_of(dir, saved_by, kind);
    ddp::MlpStage stage = ddp::make_parallel_mlp({.sizes = kSizes, .seed = 99}, mesh);
    const auto params = stage.model->parameters();
    ddp::OptimizerState st;
    st.kind = kind;
    const auto info = ddp::load_model_parallel_checkpoint(read(path), path, params, &st, mesh);
    const ddp::OptimizerState want = state_blocks(f, params);
    bool values = true, state = st.kind == kind && st.steps == f.steps && st.buffers.size() == want.buffers.size();
    for (size_t i = 0; i < params.size(); ++i) {
      values &= equal(params[i]->value, block_of(f.values.at(params[i]->name), *params[i]));
      for (size_t k = 0; k < want.buffers.size() && state; ++k) state &= equal(st.buffers[k].at(i), want.buffers[k][i]);
    }
    check(values && info.step == 11 && info.run_id == "layouts", at + " (" + kind + "): exactly this rank's blocks");
    check(state, at + " (" + kind + "): exactly this rank's blocks of the optimizer state");
  }
  ddp::MlpStage stage = ddp::make_parallel_mlp({.sizes = kSizes, .seed = 99}, mesh);
  const auto params = stage.model->parameters();
  const std::vector<float> before = launched::values_of(*stage.model);
  const std::string path = file_of(dir, saved_by, "adamw");
  std::string corrupt = read(path);
  corrupt[corrupt.size() / 3] ^= 0x21;
  std::string why;
  try {
    ddp::load_model_parallel_checkpoint(corrupt, path, params, nullptr, mesh);
  } catch (const ddp::Error& e) {
    why = e.what();
  }
  check(why.find(path) != std::string::npos && why.find("checksum") != std::string::npos &&
            launched::values_of(*stage.model) == before,
        at + ": a corrupted file fails naming it and changes nothing (" + why + ")");
  const std::string other = dir + "/other-model.ckpt";
  why.clear();
  try {
    ddp::load_model_parallel_checkpoint(read(other), other, params, nullptr, mesh);
  } catch (const ddp::Error& e) {
    why = e.what();
  }
  check(why.find(other) != std::string::npos && why.find("stored shape") != std::string::npos &&
            launched::values_of(*stage.model) == before,
        at + ": another model's file fails naming it and changes nothing (" + why + ")");
  bool plain_ok = true;
  if (pg.rank() == 0) {  // the plain model at world 1 loads it too
    auto plain = ddp::make_mlp({.sizes = kSizes});
    ddp::AdamW opt(plain->parameters(), {});
    ddp::load_checkpoint(path, *plain, &opt);
    for (auto* p : plain->parameters()) plain_ok &= equal(p->value, full_state("adamw").values.at(p->name));
  }
  check(rank0_says(pg, plain_ok), at + ": the plain model loads it with load_checkpoint");
}

}  // namespace

int main() {
  std::string dir;
  try {
    auto pg = ddp::init({.backend = "cpu"});
    launched::g_rank = pg->rank();
    if (pg->size() != 4) throw ddp::Error("layout_checks runs at 4 ranks");
    char name[64] = "/tmp/ddp-layout-checks-XXXXXX";
    if (pg->rank() == 0 && ::mkdtemp(name) == nullptr) throw ddp::Error("mkdtemp failed");
    pg->broadcast(ddp::Buffer{name, sizeof name, ddp::DType::U8, ddp::Device::Cpu}, 0);
    dir = name;
    if (pg->rank() == 0) {  // a checkpoint of another model: every Linear's shape differs
      auto other = ddp::make_mlp({.sizes = {60, 36, 28, 20, 16, 6}});
      ddp::save_checkpoint(dir + "/other-model.ckpt", *other, nullptr, {});
    }
    std::vector<ddp::DeviceMesh> meshes;
    for (const Layout& l : kLayouts) meshes.push_back(ddp::make_model_parallel_mesh(pg, l.tp, l.pp));
    const size_t n = meshes.size();
    for (size_t i = 0; i < n; ++i) {
      building(meshes[i], kLayouts[i]);
      memory(*pg, meshes[i], kLayouts[i], kSizes);
      memory(*pg, meshes[i], kLayouts[i], kWide);
      saving(*pg, meshes[i], kLayouts[i], dir);
    }
    for (size_t i = 0; i < n; ++i) loading(*pg, meshes[i], kLayouts[i], kLayouts[(i + n - 1) % n], dir);
    pg->barrier();
    if (pg->rank() == 0) std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::printf("rank %d: error: %s\n", launched::g_rank, e.what());
    return 1;
  }
  return launched::finish();
}
