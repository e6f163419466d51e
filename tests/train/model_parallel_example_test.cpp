// examples/fashion_mnist with --tp/--pp under the real ddprun on the real Fashion-MNIST
// files: after 20 optimizer steps every layout (tensor parallel, pipeline with either
// schedule, and their products with each other and with data parallelism) holds the
// parameters the unsplit model holds after the same 20 steps on one worker, within
// 1e-6 of each parameter's largest value; checkpoints move between layouts with the
// same state bytes; bad flag combinations exit 2 naming the flags.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

// One layout against the unsplit run: its world, the per-worker batch (the unsplit one
// over dp) and the base rate (the example scales it by dp).
struct Layout {
  std::string name;
  int world;
  int dp;
  std::vector<std::string> flags;
};

// Trains `layout` and the unsplit model with `optimizer` (plus `extra`), prints and
// returns the largest relative parameter difference.
double difference_after_20_steps(const Layout& layout, const std::string& optimizer,
                                 const std::vector<std::string>& extra = {}) {
  TempDir dir;
  const double lr = 1e-3;
  const auto base = with(with(kQuick, {"--optimizer", optimizer}), extra);
  train(1, with(base, {"--batch", std::to_string(kBatch), "--lr", std::to_string(lr), "--save-params",
                       (dir / "one.bin").string()}));
  const auto r = train(layout.world, with(with(base, layout.flags),
                                          {"--batch", std::to_string(kBatch / layout.dp), "--lr",
                                           std::to_string(lr / layout.dp), "--save-params", (dir / "mp.bin").string()}));
  // The run reports its layout and did 20 steps over the same rows.
  CHECK(r.out.find(" dp " + std::to_string(layout.dp) + " ") != std::string::npos);
  CHECK(fashion::epochs_run(r.out) == std::vector<int>{1});
  const double d = largest_relative_difference(read_floats((dir / "mp.bin").string()),
                                               read_floats((dir / "one.bin").string()));
  std::printf("model parallel equivalence: %s %s%s: largest relative parameter difference %.3g after %d steps\n",
              layout.name.c_str(), optimizer.c_str(), extra.empty() ? "" : " (with flags)", d, kSteps);
  return d;
}

void check_equivalent(const Layout& layout) {
  for (const std::string optimizer : {"adamw", "sgd"}) {
    INFO(layout.name << " with " << optimizer);
    CHECK(difference_after_20_steps(layout, optimizer) <= 1e-6);
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

TEST_CASE("tensor parallel tp 2 and tp 4 train as the unsplit model", "[mp-example]") {
  check_equivalent({"tp2", 2, 1, {"--tp", "2"}});
  check_equivalent({"tp4", 4, 1, {"--tp", "4"}});
}

TEST_CASE("pipeline pp 2 and pp 4, GPipe and 1F1B, train as the unsplit model", "[mp-example]") {
  check_equivalent({"pp2 gpipe", 2, 1, {"--pp", "2", "--schedule", "gpipe"}});
  check_equivalent({"pp2 1f1b", 2, 1, {"--pp", "2", "--schedule", "1f1b"}});
  check_equivalent({"pp4 gpipe", 4, 1, {"--pp", "4", "--schedule", "gpipe", "--microbatches", "8"}});
  check_equivalent({"pp4 1f1b", 4, 1, {"--pp", "4", "--schedule", "1f1b"}});
}

TEST_CASE("pp2 x tp2, dp2 x tp2 and dp2 x pp2 train as the unsplit model", "[mp-example]") {
  check_equivalent({"pp2 x tp2", 4, 1, {"--pp", "2", "--tp", "2", "--schedule", "1f1b"}});
  check_equivalent({"dp2 x tp2", 4, 2, {"--tp", "2"}});
  check_equivalent({"dp2 x pp2", 4, 2, {"--pp", "2"}});
}

TEST_CASE("ZeRO-1 and FSDP over dp, and clipping the whole model's norm, compose with tp and pp", "[mp-example]") {
  CHECK(difference_after_20_steps({"dp2 x tp2 zero1", 4, 2, {"--tp", "2", "--strategy", "zero1"}}, "adamw") <= 1e-6);
  CHECK(difference_after_20_steps({"dp2 x pp2 fsdp", 4, 2, {"--pp", "2", "--strategy", "fsdp"}}, "adamw") <= 1e-6);
  // A bound the gradients exceed, so every step is clipped by the whole model's norm.
  const std::vector<std::string> clip = {"--max-grad-norm", "0.05"};
  CHECK(difference_after_20_steps({"pp2 x tp2 clipped", 4, 1, {"--pp", "2", "--tp", "2"}}, "sgd", clip) <= 1e-6);
  CHECK(difference_after_20_steps({"dp2 x tp2 zero1 clipped", 4, 2, {"--tp", "2", "--strategy", "zero1"}}, "sgd",
                                  clip) <= 1e-6);
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
      {1, {"--microbatches", "4"}, {"--microbatches", "--pp"}},
      {1, {"--schedule", "1f1b"}, {"--schedule", "--pp"}},
      {2, {"--pp", "2", "--accumulate", "2"}, {"--accumulate", "--pp"}},
      {2, {"--tp", "3"}, {"--tp 3", "256"}},
      {2, {"--pp", "5", "--hidden", "64,64,64"}, {"--pp 5", "4 Linear"}},
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
