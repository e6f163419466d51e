// DistributedDataParallel end to end: the real fashion_mnist and linear examples
// launched by the real ddprun on the real Fashion-MNIST files (a subset of the
// training images, to stay quick).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <regex>
#include <set>

#include "checks_program.hpp"
#include "e2e.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kFashion = FASHION_MNIST_BIN;
const std::string kLinear = LINEAR_BIN;

RunResult train(int nproc, std::vector<std::string> args) {
  std::vector<std::string> argv{e2e::kDdprun, "--nproc_per_node=" + std::to_string(nproc), kFashion};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run(argv, {}, 600s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  return r;
}

// rank -> the params_hash it printed.
std::map<int, std::string> hashes(const RunResult& r) {
  std::map<int, std::string> out;
  std::regex line(R"(rank (\d+) params_hash ([0-9a-f]{16}))");
  for (auto& [rank, lines] : e2e::by_rank(r.out))
    for (auto& l : lines) {
      std::smatch m;
      if (std::regex_match(l, m, line)) out[std::stoi(m[1])] = m[2];
    }
  return out;
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

const std::vector<std::string> kQuick = {"--limit-train", "2048", "--epochs", "1", "--no-eval", "--optimizer", "sgd"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace

// ddp_checks prints "rank R: N checks, 0 failed" last on every rank when all held;
// three of its checks need peers.
int expected_checks(int nproc) { return nproc > 1 ? 25 : 22; }

void run_checks(int nproc) {
  e2e::run_checks_program(DDP_CHECKS_BIN, nproc, 300s, [nproc](int) { return expected_checks(nproc); });
}

TEST_CASE("DDP mechanism, 3 ranks: broadcast at construction, bucket layout, overlap, identical steps, no_sync, clipping",
          "[ddp]") {
  run_checks(3);
}

TEST_CASE("DDP mechanism, 1 rank: the same promises hold alone", "[ddp]") { run_checks(1); }

TEST_CASE("a C++ program using ddp::init() runs under real torchrun too", "[ddp][torchrun]") {
  // torchrun's agent holds its own store on MASTER_PORT; the runtime's rank 0 hosts
  // ours on a port every rank derives from it. Debian's torchrun (python3-torch).
  const int port = e2e::free_port();
  auto r = run({"/usr/bin/python3", TORCHRUN_PY, "--nproc_per_node=2", "--monitor_interval", "0.1",
                "--master_port", std::to_string(port), "--no_python", DDP_CHECKS_BIN},
               {}, 300s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 0);
  for (int rank : {0, 1}) {
    const std::string line = "rank " + std::to_string(rank) + ": " + std::to_string(expected_checks(2)) + " checks, 0 failed";
    CHECK(r.out.find(line) != std::string::npos);
  }
}

TEST_CASE("parameters are bit-identical on every rank after training", "[ddp]") {
  auto r = train(3, with(kQuick, {"--first-bucket-kib", "64", "--bucket-cap-kib", "256"}));
  auto h = hashes(r);
  REQUIRE(h.size() == 3);
  CHECK(h[0] == h[1]);
  CHECK(h[0] == h[2]);
}

TEST_CASE("N ranks with batch b match one process with batch N*b", "[ddp]") {
  TempDir dir;
  // The example scales the learning rate by the world size: give one process N times the base.
  train(1, with(kQuick, {"--batch", "64", "--lr", "0.04", "--save-params", (dir / "one.bin").string()}));
  train(2, with(kQuick, {"--batch", "32", "--lr", "0.02", "--save-params", (dir / "two.bin").string()}));
  train(4, with(kQuick, {"--batch", "16", "--lr", "0.01", "--save-params", (dir / "four.bin").string(),
                         "--first-bucket-kib", "32"}));
  // Only the order of float additions differs: measured 4.5e-8 (1-2 ulp of weights
  // up to 0.3) after 32 SGD steps; the bound leaves about 30 ulp.
  const auto one = read_floats((dir / "one.bin").string());
  CHECK(max_abs_diff(one, read_floats((dir / "two.bin").string())) < 1e-6);
  CHECK(max_abs_diff(one, read_floats((dir / "four.bin").string())) < 1e-6);
}

TEST_CASE("gradient accumulation with no_sync matches the large batch", "[ddp]") {
  TempDir dir;
  train(1, with(kQuick, {"--batch", "64", "--lr", "0.04", "--save-params", (dir / "big.bin").string()}));
  train(2, with(kQuick, {"--batch", "16", "--accumulate", "2", "--lr", "0.02", "--save-params",
                         (dir / "acc.bin").string()}));
  CHECK(max_abs_diff(read_floats((dir / "big.bin").string()), read_floats((dir / "acc.bin").string())) < 1e-6);
}

TEST_CASE("resuming from a checkpoint continues exactly as an uninterrupted run", "[ddp][checkpoint]") {
  TempDir dir;
  const std::vector<std::string> base = {"--limit-train", "2048", "--epochs", "3", "--no-eval"};
  auto whole = train(2, with(base, {"--checkpoint", (dir / "a.ckpt").string()}));
  auto first = train(2, with(base, {"--checkpoint", (dir / "b.ckpt").string(), "--stop-after", "1"}));
  CHECK(first.out.find("stopping after epoch 1") != std::string::npos);
  auto rest = train(2, with(base, {"--checkpoint", (dir / "b.ckpt").string(), "--resume"}));
  CHECK(rest.out.find("resumed from") != std::string::npos);
  CHECK(rest.out.find("epoch 1 loss") == std::string::npos);  // epoch 1 was not run again
  const auto a = hashes(whole), b = hashes(rest);
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK(a.at(0) == b.at(0));
  CHECK(a.at(1) == b.at(1));
  CHECK(hashes(first).at(0) != a.at(0));  // the interrupted run really was behind
}

TEST_CASE("a missing dataset gives one clear error and exit status 1", "[ddp]") {
  auto r = run({e2e::kDdprun, "--nproc_per_node=2", kFashion, "--data", "/nonexistent/fashion-mnist"}, {}, 60s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  CHECK((r.out + r.err).find("apt install dataset-fashion-mnist") != std::string::npos);
}

// How many CUDA devices this machine has (nvidia-smi's list; 0 when no driver answers).
int cuda_devices() {
  auto r = run({"nvidia-smi", "--list-gpus"}, {}, 30s);
  if (r.status != 0) return 0;
  int n = 0;
  for (size_t p = r.out.find("GPU "); p != std::string::npos; p = r.out.find("GPU ", p + 1)) ++n;
  return n;
}

TEST_CASE("the example trains on the GPU (--device cuda) with the ranks in step", "[ddp][gpu]") {
  if (!DDPRUN_HAVE_CUDA) {
    WARN("SKIPPED: this build has no CUDA (CMake found no working nvcc)");
    return;
  }
  const int gpus = cuda_devices();
  if (gpus < 1) {
    WARN("SKIPPED: no CUDA device (nvidia-smi lists none)");
    return;
  }
  const int nproc = std::min(gpus, 2);
  auto r = train(nproc, {"--device", "cuda", "--limit-train", "8192", "--epochs", "2", "--first-bucket-kib", "64",
                         "--bucket-cap-kib", "256"});
  CHECK(r.out.find("on cuda") != std::string::npos);
  if (nproc > 1) CHECK(r.out.find("nccl") != std::string::npos);
  auto h = hashes(r);
  REQUIRE(static_cast<int>(h.size()) == nproc);
  for (auto& [rank, hash] : h) CHECK(hash == h.at(0));
  // Two epochs on 8k images reach well above chance (10%) on the test set.
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex(R"(RESULT world \d+ test_acc ([0-9.]+))")));
  CHECK(std::stod(m[1]) > 0.7);
}

TEST_CASE("the example asked for --device cuda without a usable GPU exits 2 and says why", "[ddp]") {
  if (DDPRUN_HAVE_CUDA && cuda_devices() > 0) {
    SUCCEED("a GPU is present; the [gpu] case covers --device cuda");
    return;
  }
  auto r = run({e2e::kDdprun, "--nproc_per_node=2", kFashion, "--device", "cuda"}, {}, 60s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 2);
  CHECK((r.out + r.err).find("--device cuda: ") != std::string::npos);
  CHECK(r.err.find("terminate") == std::string::npos);  // an error message, not a crash
}

TEST_CASE("bad flags of the example exit 2 with a message", "[ddp]") {
  auto r = run({e2e::kDdprun, "--nproc_per_node=1", kFashion, "--optimizer", "lamb"}, {}, 60s);
  CHECK(r.status == 2);
  CHECK((r.out + r.err).find("optimizer") != std::string::npos);
}

TEST_CASE("the trace option writes a Chrome trace with every rank's forward backward and all-reduce", "[ddp][trace]") {
  TempDir dir;
  const auto path = (dir / "trace.json").string();
  train(2, with(kQuick, {"--trace", path, "--first-bucket-kib", "64"}));
  // Parse it as JSON with Python's json module and summarise what it holds.
  auto r = run({"python3", "-c",
                "import json,sys\n"
                "t=json.load(open(sys.argv[1]))['traceEvents']\n"
                "print(sorted({(e['pid'],e['name']) for e in t if e['ph']=='X'}))",
                path},
               {}, 60s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  for (int rank : {0, 1}) {
    for (const char* name : {"forward", "backward", "optimizer step", "all_reduce bucket"}) {
      CHECK(r.out.find(std::string("(") + std::to_string(rank) + ", '" + name + "')") != std::string::npos);
    }
  }
}

TEST_CASE("the linear example trains with 2 workers and rank 0 prints the loss", "[ddp]") {
  auto r = run({e2e::kDdprun, "--nproc_per_node=2", kLinear}, {}, 120s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks.count(0) == 1);
  CHECK(ranks.count(1) == 0);  // only rank 0 prints
  std::smatch m1, m2;
  REQUIRE(ranks[0].size() == 2);
  REQUIRE(std::regex_match(ranks[0][0], m1, std::regex(R"(epoch 1 loss ([\d.]+))")));
  REQUIRE(std::regex_match(ranks[0][1], m2, std::regex(R"(epoch 2 loss ([\d.]+))")));
  CHECK(std::stod(m2[1]) < std::stod(m1[1]));
}
