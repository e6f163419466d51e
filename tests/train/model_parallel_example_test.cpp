// examples/fashion_mnist with --tp/--pp under the real ddprun on the real Fashion-MNIST
// files: after 20 optimizer steps every layout (tensor parallel, pipeline with either
// schedule, and their products with each other and with data parallelism) holds the
// parameters the unsplit model holds after the same 20 steps on one worker (SGD within
// 1e-6 of each parameter's largest value, AdamW see kAdamwReorderedBound), and bit for
// bit those of the run that adds its gradients in the same order. Checkpoints move
// between layouts with the same state bytes; evaluation through the pipeline reports the
// unsplit model's loss and accuracy; bad flag combinations exit 2 naming the flags.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "e2e.hpp"
#include "fashion_output.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kFashion = FASHION_MNIST_BIN;

// 20 steps of 64 rows through 784-64-64-64-10 (4 Linears: pp 4 has one each), in order.
constexpr int kSteps = 20;
constexpr int kBatch = 64;
const std::vector<std::string> kQuick = {"--limit-train", std::to_string(kSteps * kBatch), "--epochs", "1",
                                         "--no-eval", "--no-shuffle", "--hidden", "64,64,64"};
// The unsplit model's parameters in order: rows x cols of each.
const std::vector<std::pair<size_t, size_t>> kShapes = {{64, 784}, {1, 64}, {64, 64}, {1, 64},
                                                        {64, 64},  {1, 64}, {10, 64}, {1, 10}};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// ddprun --nproc_per_node=N fashion_mnist ARGS..., which must succeed.
RunResult train(int nproc, const std::vector<std::string>& args) {
  std::vector<std::string> argv{e2e::kDdprun, "--nproc_per_node=" + std::to_string(nproc), kFashion};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run(argv, {}, 120s);
  INFO("ddprun --nproc_per_node=" << nproc << " fashion_mnist ...\nstdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  return r;
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// The largest over parameters of max|a - b| / max|b| (each parameter of kShapes).
double largest_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  size_t total = 0;
  for (auto [r, c] : kShapes) total += r * c;
  REQUIRE(a.size() == total);
  REQUIRE(b.size() == total);
  double worst = 0;
  size_t at = 0;
  for (auto [r, c] : kShapes) {
    double diff = 0, scale = 0;
    for (size_t i = at; i < at + r * c; ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    }
    REQUIRE(scale > 0);
    worst = std::max(worst, diff / scale);
    at += r * c;
  }
  return worst;
}

// A run of the example: its world, data-parallel replicas and flags, and the micro-batches
// it accumulates per step (--accumulate). The per-worker batch is kBatch / dp /
// accumulate and the base rate lr / dp (the example scales it by dp), so every run takes
// the same 20 steps over the same 64 rows each.
struct Layout {
  std::string name;
  int world;
  int dp;
  std::vector<std::string> flags;
  int accumulate = 1;
};

constexpr double kLr = 1e-3;

// Trains `layout` with `optimizer` (plus `extra`) and returns its final parameters.
std::vector<float> train_params(const Layout& layout, const std::string& optimizer,
                                const std::vector<std::string>& extra = {}) {
  TempDir dir;
  const std::string out = (dir / "params.bin").string();
  const int batch = kBatch / layout.dp / layout.accumulate;
  const auto flags = with(layout.flags, {"--batch", std::to_string(batch), "--accumulate",
                                         std::to_string(layout.accumulate), "--lr", std::to_string(kLr / layout.dp),
                                         "--save-params", out});
  const auto r = train(layout.world, with(with(with(kQuick, {"--optimizer", optimizer}), extra), flags));
  // The run reports its layout and did its one epoch over the same rows.
  CHECK(r.out.find(" dp " + std::to_string(layout.dp) + " ") != std::string::npos);
  CHECK(fashion::epochs_run(r.out) == std::vector<int>{1});
  return read_floats(out);
}

// The largest relative parameter difference of `layout` from `reference`, printed.
double compare(const std::string& what, const std::vector<float>& params, const std::vector<float>& reference) {
  const double d = largest_relative_difference(params, reference);
  std::printf("model parallel equivalence: %s: largest relative parameter difference %.3g after %d steps\n",
              what.c_str(), d, kSteps);
  return d;
}

const Layout kUnsplit{"unsplit, one worker", 1, 1, {}};

// The layouts of the targets, and, where one exists, a run without the model split that
// adds its gradients in the same order (the pipeline's micro-batches are gradient
// accumulation in micro-batch order): those must match bit for bit.
struct Target {
  Layout layout;
  std::optional<Layout> same_order;
};
const std::vector<Target> kTargets = {
    {{"tp2", 2, 1, {"--tp", "2"}}, std::nullopt},
    {{"tp4", 4, 1, {"--tp", "4"}}, std::nullopt},
    {{"pp2 gpipe", 2, 1, {"--pp", "2", "--schedule", "gpipe"}}, Layout{"accumulate 4", 1, 1, {}, 4}},
    {{"pp2 1f1b", 2, 1, {"--pp", "2", "--schedule", "1f1b"}}, Layout{"accumulate 4", 1, 1, {}, 4}},
    {{"pp4 gpipe", 4, 1, {"--pp", "4", "--schedule", "gpipe", "--microbatches", "8"}},
     Layout{"accumulate 8", 1, 1, {}, 8}},
    {{"pp4 1f1b", 4, 1, {"--pp", "4", "--schedule", "1f1b"}}, Layout{"accumulate 4", 1, 1, {}, 4}},
    {{"pp2 x tp2", 4, 1, {"--pp", "2", "--tp", "2", "--schedule", "1f1b"}},
     Layout{"tp2 accumulate 4", 2, 1, {"--tp", "2"}, 4}},
    {{"dp2 x tp2", 4, 2, {"--tp", "2"}}, std::nullopt},
    {{"dp2 x pp2", 4, 2, {"--pp", "2"}}, Layout{"dp2 accumulate 4", 2, 2, {}, 4}},
};

// AdamW divides each update by the gradient's running RMS, so where an element's
// gradient nearly cancels, a rounding difference in it becomes an update difference of
// up to lr. Tensor parallelism sums each row-parallel product in parts, and a pipeline
// adds its micro-batches' gradients (as --accumulate does), each in another order than
// the unsplit batch's GEMM: after 20 AdamW steps at lr 1e-3 these layouts end 5e-6 to
// 1.1e-5 apart from it (plain DDP's reordered all-reduce alone: 8e-7), where SGD stays at
// 1e-7. The target's 1e-6 holds for SGD everywhere and, bit for bit, for every run
// against the one that sums in its order; AdamW against the whole batch is held to this
// bound instead.
constexpr double kAdamwReorderedBound = 2e-5;

void check_targets(const std::string& optimizer) {
  const std::vector<float> whole = train_params(kUnsplit, optimizer);
  std::map<std::string, std::vector<float>> references;
  for (const Target& t : kTargets) {
    INFO(t.layout.name << " with " << optimizer);
    const std::vector<float> params = train_params(t.layout, optimizer);
    const double d = compare(t.layout.name + " " + optimizer + " vs the unsplit batch", params, whole);
    CHECK(d <= (optimizer == "sgd" ? 1e-6 : kAdamwReorderedBound));
    if (!t.same_order) continue;
    const Layout& r = *t.same_order;
    if (!references.count(r.name)) references[r.name] = train_params(r, optimizer);
    CHECK(compare(t.layout.name + " " + optimizer + " vs " + r.name, params, references[r.name]) == 0);
  }
}

// A checkpoint file's state (parameters, then optimizer), without the header and the
// info (epoch, step and run id may differ between writers).
std::string state_of(const std::string& file) {
  constexpr size_t kHeader = 24;  // magic, version, size, CRC-32
  REQUIRE(file.size() > kHeader + 20);
  uint32_t run_id = 0;
  std::memcpy(&run_id, file.data() + kHeader + 16, 4);
  const size_t state_at = kHeader + 20 + run_id;
  REQUIRE(file.size() > state_at);
  return file.substr(state_at);
}

}  // namespace

TEST_CASE("tp 2 and 4 and pp 2 and 4 in both schedules and their products train as the unsplit model with SGD",
          "[mp-example]") {
  check_targets("sgd");
}

TEST_CASE("tp 2 and 4 and pp 2 and 4 in both schedules and their products train as the unsplit model with AdamW",
          "[mp-example]") {
  check_targets("adamw");
}

TEST_CASE("ZeRO-1 and FSDP over dp and clipping the whole model's norm compose with tp and pp", "[mp-example]") {
  const std::vector<float> whole = train_params(kUnsplit, "sgd");
  // FSDP under 1F1B: a stage's forwards and backwards interleave, so each micro-batch's
  // backward must find its own forward's gathered layers (per activation slot).
  const std::vector<Layout> sharded = {
      {"dp2 x tp2 zero1", 4, 2, {"--tp", "2", "--strategy", "zero1"}},
      {"dp2 x pp2 zero1", 4, 2, {"--pp", "2", "--strategy", "zero1"}},
      {"dp2 x pp2 fsdp", 4, 2, {"--pp", "2", "--strategy", "fsdp"}},
      {"dp2 x pp2 fsdp 1f1b", 4, 2, {"--pp", "2", "--strategy", "fsdp", "--schedule", "1f1b"}},
      {"tp2 fsdp", 2, 1, {"--tp", "2", "--strategy", "fsdp"}}};
  for (const Layout& l : sharded) CHECK(compare(l.name + " sgd", train_params(l, "sgd"), whole) <= 1e-6);
  // A bound the gradients exceed, so every step is clipped by the whole model's norm
  // (unclipped, the parameters end 1e-2 apart from clipped ones).
  const std::vector<std::string> clip = {"--max-grad-norm", "0.05"};
  const std::vector<float> clipped = train_params(kUnsplit, "sgd", clip);
  CHECK(compare("unclipped vs clipped sgd", whole, clipped) > 1e-3);
  const std::vector<Layout> layouts = {{"pp2 x tp2", 4, 1, {"--pp", "2", "--tp", "2"}},
                                       {"dp2 x tp2 zero1", 4, 2, {"--tp", "2", "--strategy", "zero1"}},
                                       {"dp2 x tp2 fsdp", 4, 2, {"--tp", "2", "--strategy", "fsdp"}}};
  for (const Layout& l : layouts) {
    CHECK(compare(l.name + " sgd clipped", train_params(l, "sgd", clip), clipped) <= 1e-6);
  }
  // Gradients in bf16 on the dp wire compose too (dp reduces them, tp never sees them).
  auto r = train(4, with(kQuick, {"--tp", "2", "--batch", "32", "--grad_dtype", "bf16"}));
  CHECK(r.out.find("grad_dtype bf16 tp 2 pp 1 dp 2 ") != std::string::npos);
  // The largest rank's parameter bytes: its blocks of the two column/row pairs (32x784+32,
  // 64x32+64, 32x64+32, 10x32+10 floats: row-parallel biases whole); AdamW's rank also
  // holds as many bytes of gradients and twice as many of state.
  const std::regex bytes(R"(RESULT .* param_bytes ([0-9]+) held_bytes ([0-9]+))");
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, bytes));
  const double params = std::stod(m[1].str()), held = std::stod(m[2].str());
  CHECK(params == 4.0 * (32 * 784 + 32 + 64 * 32 + 64 + 32 * 64 + 32 + 10 * 32 + 10));
  CHECK(held == 4 * params);
}

TEST_CASE("the loss and the test accuracy through the pipeline and tp are the unsplit model's", "[mp-example]") {
  // The same 20 SGD steps, then the whole test set: the logits live on the last stage
  // and each replica's metrics are counted once (4 decimals, as printed).
  const auto quick = with(kQuick, {"--optimizer", "sgd"});
  std::vector<std::string> args;
  for (const auto& a : quick) {
    if (a != "--no-eval") args.push_back(a);
  }
  const std::regex metrics(R"(epoch 1 (loss [0-9.]+ test_acc [0-9.]+) )");
  auto metrics_of = [&](int world, int dp, const std::vector<std::string>& flags) {
    const auto r = train(world, with(with(args, flags), {"--batch", std::to_string(kBatch / dp), "--lr",
                                                         std::to_string(kLr / dp)}));
    std::smatch m;
    REQUIRE(std::regex_search(r.out, m, metrics));
    return m[1].str();
  };
  const std::string whole = metrics_of(1, 1, {});
  CHECK(whole.find("test_acc 0.0000") == std::string::npos);
  CHECK(metrics_of(4, 1, {"--pp", "2", "--tp", "2"}) == whole);
  CHECK(metrics_of(2, 1, {"--pp", "2", "--schedule", "1f1b"}) == whole);
  CHECK(metrics_of(4, 2, {"--tp", "2", "--strategy", "fsdp"}) == whole);
}

TEST_CASE("a checkpoint moves between pp2 x tp2 and the plain model at world 1 with the same state",
          "[mp-example][checkpoint]") {
  struct Move {
    std::string name;
    int from_world;
    std::vector<std::string> from;
    int to_world;
    std::vector<std::string> to;
  };
  const std::vector<std::string> plain, mesh = {"--pp", "2", "--tp", "2"};
  const std::vector<Move> moves = {{"pp2 x tp2 -> world 1", 4, mesh, 1, plain},
                                   {"world 1 -> pp2 x tp2", 1, plain, 4, mesh},
                                   {"dp2 x tp2 (fsdp) -> dp2 x pp2 (zero1)", 4,
                                    {"--tp", "2", "--strategy", "fsdp"}, 4, {"--pp", "2", "--strategy", "zero1"}}};
  for (const Move& m : moves) {
    DYNAMIC_SECTION(m.name) {
      TempDir dir;
      const std::string saved = (dir / "a.ckpt").string(), again = (dir / "b.ckpt").string();
      const auto args = with(kQuick, {"--batch", "32", "--checkpoint", saved});
      train(m.from_world, with(args, m.from));
      // Epoch 1 of 1 is done: the second job resumes with nothing left to run and writes
      // what it loaded, cut for its own layout and assembled again.
      auto r = train(m.to_world, with(with(args, m.to), {"--resume", "--final-checkpoint", again}));
      CHECK(fashion::resumed_at(r.out) == std::vector<int>{2});
      CHECK(fashion::epochs_run(r.out).empty());
      const std::string a = state_of(read_file(saved)), b = state_of(read_file(again));
      CHECK(a.size() == b.size());
      CHECK(a == b);
    }
  }
}

TEST_CASE("bad --tp/--pp combinations give one clear error and exit status 2", "[mp-example]") {
  struct Bad {
    int nproc;
    std::vector<std::string> args;
    std::vector<std::string> named;  // each must appear in the error
  };
  const std::vector<Bad> cases = {
      {2, {"--tp", "2", "--pp", "2"}, {"--tp 2", "--pp 2", "world of 2"}},
      {3, {"--tp", "2"}, {"--tp 2", "world of 3"}},
      // The world is named before a width that would not split either.
      {3, {"--tp", "2", "--hidden", "63"}, {"--tp 2 --pp 1: tp x pp = 2 does not divide the world of 3"}},
      {1, {"--microbatches", "4"}, {"--microbatches", "--pp"}},
      {1, {"--schedule", "1f1b"}, {"--schedule", "--pp"}},
      {2, {"--pp", "2", "--accumulate", "2"}, {"--accumulate", "--pp"}},
      {3, {"--tp", "3"}, {"--tp 3", "256"}},
      {4, {"--pp", "4", "--hidden", "64"}, {"--pp 4", "2 Linear"}},
      {2, {"--tp", "2", "--device", "cuda"}, {"--device cuda", "--tp"}},
      {2, {"--pp", "2", "--schedule", "zigzag"}, {"--schedule"}},
      {1, {"--tp", "0"}, {"--tp"}},
  };
  for (const Bad& c : cases) {
    std::vector<std::string> argv{e2e::kDdprun, "--nproc_per_node=" + std::to_string(c.nproc), kFashion};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = run(argv, {}, 60s);
    std::string shown;
    for (const auto& s : c.args) shown += s + " ";
    INFO(shown << "\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.status == 2);
    for (const auto& n : c.named) CHECK((r.out + r.err).find(n) != std::string::npos);
    CHECK((r.out + r.err).find("epoch 1 loss") == std::string::npos);
  }
}

TEST_CASE("a tp group across two hosts: the mesh's refusal names the flags and exits 2", "[mp-example]") {
  // Two agents on this host with one worker each (LOCAL_WORLD_SIZE 1): tp 2 would span them.
  const std::vector<std::string> common = {"--nnodes=2", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                                           "--master_port=" + std::to_string(e2e::free_port())};
  std::vector<std::unique_ptr<Process>> nodes;
  for (const std::string node : {"1", "0"}) {
    nodes.push_back(std::make_unique<Process>(
        with(with({e2e::kDdprun}, common), {"--node_rank=" + node, kFashion, "--tp", "2"})));
  }
  for (auto& node : nodes) {
    const auto status = node->wait(60s);
    INFO("stdout: " << node->out() << "\nstderr: " << node->err());
    REQUIRE(status.has_value());
    CHECK(*status == 2);
    CHECK(node->err().find("fashion_mnist: --tp 2 --pp 1: ") != std::string::npos);
    CHECK(node->err().find("axis 'tp' (size 2) must stay within") != std::string::npos);
  }
}
