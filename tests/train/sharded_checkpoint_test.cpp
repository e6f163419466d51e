// Checkpoints across strategies and world sizes: examples/fashion_mnist under
// the real ddprun saves one full file whatever its strategy (DDP, ZeRO-1, FSDP) and
// world, and every strategy at any world resumes from it. From the same state, each
// strategy writes the same bytes: a file is loaded under another strategy and world
// and written again at once (--final-checkpoint with no epoch left to run), and its
// parameters and optimizer state must equal the original's byte for byte.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "e2e.hpp"
#include "fashion_output.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kFashion = FASHION_MNIST_BIN;

// A quick run: a slice of the training set, no test pass.
const std::vector<std::string> kQuick = {"--limit-train", "1536", "--no-eval"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// ddprun --nproc_per_node=N fashion_mnist --strategy S ARGS..., which must succeed.
RunResult train(int nproc, const std::string& strategy, const std::vector<std::string>& args) {
  std::vector<std::string> argv{e2e::kDdprun, "--nproc_per_node=" + std::to_string(nproc), kFashion, "--strategy",
                                strategy};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run(argv, {}, 300s);
  INFO("ddprun --nproc_per_node=" << nproc << " fashion_mnist --strategy " << strategy << "\nstdout: " << r.out
                                  << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  return r;
}

// The params_hash every rank printed (rank -> hash).
std::map<int, std::string> hashes(const RunResult& r) {
  std::map<int, std::string> out;
  const std::regex line(R"(rank (\d+) params_hash ([0-9a-f]{16}))");
  for (auto& [rank, lines] : e2e::by_rank(r.out)) {
    for (auto& l : lines) {
      std::smatch m;
      if (std::regex_match(l, m, line)) out[std::stoi(m[1])] = m[2];
    }
  }
  return out;
}

// A checkpoint file split into the info that says where training stands (epoch, step,
// run id: the step count and run id legitimately differ between the two writers) and
// the state itself (parameters, then the optimizer), which must not.
struct Split {
  int64_t epoch = -1;
  std::string state;
};
Split split(const std::string& file) {
  constexpr size_t kHeader = 24;  // magic, version, size, CRC-32
  REQUIRE(file.size() > kHeader + 20);
  Split s;
  std::memcpy(&s.epoch, file.data() + kHeader, 8);
  uint32_t run_id = 0;
  std::memcpy(&run_id, file.data() + kHeader + 16, 4);
  const size_t state_at = kHeader + 20 + run_id;
  REQUIRE(file.size() > state_at);
  s.state = file.substr(state_at);
  return s;
}

}  // namespace

TEST_CASE("a job saved under FSDP on 2 workers resumes under ZeRO-1 on 3 and finishes", "[ddp][checkpoint][sharded]") {
  TempDir dir;
  const std::string ckpt = (dir / "fm.ckpt").string();
  const auto args = with(kQuick, {"--epochs", "2", "--checkpoint", ckpt});
  auto first = train(2, "fsdp", with(args, {"--stop-after", "1"}));
  CHECK(fashion::epochs_run(first.out) == std::vector<int>{1});
  CHECK(first.out.find("strategy fsdp grad_dtype f32") != std::string::npos);

  auto rest = train(3, "zero1", with(args, {"--resume"}));
  INFO(rest.out);
  CHECK(fashion::resumed_at(rest.out) == std::vector<int>{2});
  CHECK(fashion::epochs_run(rest.out) == std::vector<int>{2});
  CHECK(rest.out.find("RESULT world 3 ") != std::string::npos);
  const auto h = hashes(rest);
  REQUIRE(h.size() == 3);
  for (auto& [rank, hash] : h) CHECK(hash == h.at(0));
}

TEST_CASE("a checkpoint loaded under another strategy and world and saved again has the same state bytes",
          "[ddp][checkpoint][sharded]") {
  struct Pair {
    std::string from;
    int from_world;
    std::string to;
    int to_world;
    std::string optimizer;
  };
  // DDP -> FSDP, FSDP -> ZeRO-1, ZeRO-1 -> DDP on one worker, FSDP -> FSDP on fewer
  // workers (the shards re-cut), and SGD's optional momentum through ZeRO-1 and FSDP.
  const std::vector<Pair> pairs = {{"ddp", 2, "fsdp", 3, "adamw"},
                                   {"fsdp", 2, "zero1", 3, "adamw"},
                                   {"zero1", 3, "ddp", 1, "adamw"},
                                   {"fsdp", 3, "fsdp", 2, "adamw"},
                                   {"zero1", 2, "fsdp", 3, "sgd"}};
  for (const Pair& p : pairs) {
    DYNAMIC_SECTION(p.from << "@" << p.from_world << " -> " << p.to << "@" << p.to_world << " (" << p.optimizer
                           << ")") {
      TempDir dir;
      const std::string saved = (dir / "a.ckpt").string(), again = (dir / "b.ckpt").string();
      const auto args = with(kQuick, {"--epochs", "1", "--optimizer", p.optimizer});
      train(p.from_world, p.from, with(args, {"--checkpoint", saved}));
      // Epoch 1 of 1 is done: the second job resumes with nothing to run and writes
      // what it loaded, through its own strategy's sharding and gathering.
      auto r = train(p.to_world, p.to, with(args, {"--checkpoint", saved, "--resume", "--final-checkpoint", again}));
      CHECK(fashion::resumed_at(r.out) == std::vector<int>{2});
      CHECK(fashion::epochs_run(r.out).empty());
      const Split a = split(read_file(saved)), b = split(read_file(again));
      CHECK(a.epoch == 1);
      CHECK(b.epoch == 1);
      CHECK(a.state.size() == b.state.size());
      CHECK(a.state == b.state);
    }
  }
}

TEST_CASE("bad strategy flags give one clear error and exit status 2", "[ddp][sharded]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--strategy", "foo"}, "--strategy"},
      {{"--grad_dtype", "f16"}, "--grad_dtype"},
      {{"--grad-dtype", "f16"}, "--grad_dtype"},
      {{"--wide", "--hidden", "64,32"}, "--wide"},
      {{"--strategy", "zero1", "--no-allreduce"}, "--no-allreduce"},
  };
  for (const auto& [args, named] : cases) {
    std::vector<std::string> argv{e2e::kDdprun, "--nproc_per_node=1", kFashion};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run(argv, {}, 120s);
    INFO(args[0] << " " << args[1] << "\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.status == 2);
    CHECK((r.out + r.err).find(named) != std::string::npos);
    CHECK((r.out + r.err).find("epoch 1 loss") == std::string::npos);
  }
}
