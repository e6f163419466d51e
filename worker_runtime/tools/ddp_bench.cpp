// ddp-bench: collective bandwidth and latency, in the manner of nccl-tests'
// all_reduce_perf. Launch it with ddprun (or any launcher ddp::init() knows):
//
//   ddprun --nproc_per_node=2 ddp-bench -b 8 -e 256M -f 2 -o all_reduce
//
// Columns (nccl-tests' definitions): size = bytes of the user buffer (all_gather:
// the output, reduce_scatter: the input); time = mean microseconds per call, the
// largest over ranks; algbw = size / time; busbw = algbw times the bytes each
// rank must move relative to size: all_reduce 2(n-1)/n, all_gather and
// reduce_scatter (n-1)/n, broadcast 1. --device cuda puts the buffers in GPU memory
// (the GPU numbered LOCAL_RANK), where the group's nccl member moves them.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/init.hpp"

#if DDPRUN_BENCH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

#if DDPRUN_BENCH_CUDA
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
// Device memory for one buffer: what --device cuda measures.
struct DeviceMemory {
  void* p = nullptr;
  explicit DeviceMemory(size_t bytes) { cuda_check(cudaMalloc(&p, std::max<size_t>(bytes, 4)), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(p); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};
#endif

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  const std::string unit = s.substr(pos);
  double mult = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") throw std::invalid_argument("bad size '" + s + "' (use e.g. 8, 64K, 256M)");
  return static_cast<size_t>(v * mult);
}

struct Config {
  size_t min_bytes = 8;
  size_t max_bytes = 256u << 20;
  double factor = 2;
  std::string ops = "all_reduce";
  int warmup = 3;
  int max_iters = 1000000;
  double target_ms = 150;  // time spent per size (decides the iteration count)
  bool check = true;
  bool group_memory = false;
  bool cuda = false;  // --device cuda: buffers in GPU memory (cudaMalloc)
};

double busbw_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter") return static_cast<double>(n - 1) / n;
  return 1.0;  // broadcast
}

// One call of `op` on buffers sized for `bytes` (f32 elements): plain heap memory,
// or the group's own (ProcessGroup::allocate, like nccl-tests' -R).
struct Case {
  std::string op;
  ddp::ProcessGroup& pg;
  std::vector<std::unique_ptr<ddp::GroupMemory>> memory;
  std::vector<std::vector<float>> heap;
#if DDPRUN_BENCH_CUDA
  std::vector<std::unique_ptr<DeviceMemory>> device;
#endif
  std::span<float> in, out;
  bool cuda;
  size_t bytes;

  Case(std::string o, ddp::ProcessGroup& g, size_t b, bool group_memory, bool on_cuda)
      : op(std::move(o)), pg(g), cuda(on_cuda), bytes(b) {
    const size_t n = static_cast<size_t>(pg.size());
    const size_t count = b / sizeof(float);
    size_t in_count = count, out_count = 0;
    if (op == "all_gather") in_count = count / n, out_count = count / n * n;
    else if (op == "reduce_scatter") in_count = count / n * n, out_count = count / n;
    in = make(in_count, group_memory);
    out = make(out_count, group_memory);
    upload(in, std::vector<float>(in.size(), 1.0f));
  }
  std::span<float> make(size_t count, bool group_memory) {
#if DDPRUN_BENCH_CUDA
    if (cuda) {
      device.push_back(std::make_unique<DeviceMemory>(count * sizeof(float)));
      return {static_cast<float*>(device.back()->p), count};
    }
#endif
    if (!group_memory) return heap.emplace_back(count, 0.0f);
    memory.push_back(pg.allocate(count * sizeof(float)));
    return {reinterpret_cast<float*>(memory.back()->data()), count};
  }
  ddp::Buffer buffer(std::span<float> s) const {
    ddp::Buffer b = ddp::view(s);
    if (cuda) b.device = ddp::Device::Cuda;
    return b;
  }
  // Host values into a buffer, and a buffer's values back (copies for --device cuda).
  void upload(std::span<float> dst, const std::vector<float>& v) {
#if DDPRUN_BENCH_CUDA
    if (cuda) {
      cuda_check(cudaMemcpy(dst.data(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
      return;
    }
#endif
    std::copy(v.begin(), v.end(), dst.begin());
  }
  std::vector<float> download(std::span<float> src) {
    std::vector<float> v(src.size());
#if DDPRUN_BENCH_CUDA
    if (cuda) {
      cuda_check(cudaMemcpy(v.data(), src.data(), v.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
      return v;
    }
#endif
    std::copy(src.begin(), src.end(), v.begin());
    return v;
  }
  void run() {
    if (op == "all_reduce") pg.all_reduce(buffer(in));
    else if (op == "broadcast") pg.broadcast(buffer(in), 0);
    else if (op == "all_gather") pg.all_gather(buffer(in), buffer(out));
    else pg.reduce_scatter(buffer(in), buffer(out));
  }
  // One call on inputs that depend on the rank and the position (small integers,
  // exact in f32): whether every rank got what the collective promises. A uniform
  // input would let a broadcast or all_gather that moved nothing look right.
  static float value(int rank, size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 7)); }
  bool correct() {
    const int n = pg.size(), r = pg.rank();
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    std::vector<float> input(in.size());
    for (size_t i = 0; i < in.size(); ++i) input[i] = value(r, i);
    upload(in, input);
    run();
    auto all = [this](std::span<float> buf, auto want) {
      const std::vector<float> s = download(buf);
      for (size_t i = 0; i < s.size(); ++i)
        if (s[i] != want(i)) return false;
      return true;
    };
    // Sum over ranks q of value(q, i) = n(n+1)/2 + n * (i % 7).
    auto summed = [&](size_t i) { return ranks_sum + static_cast<float>(n * static_cast<int>(i % 7)); };
    if (op == "all_reduce") return all(in, summed);
    if (op == "reduce_scatter") return all(out, [&](size_t i) { return summed(static_cast<size_t>(r) * out.size() + i); });
    if (op == "all_gather") return all(out, [&](size_t i) { return value(static_cast<int>(i / in.size()), i % in.size()); });
    return all(in, [](size_t i) { return value(0, i); });  // broadcast from rank 0
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddp-bench: collective bandwidth (nccl-tests style); launch with ddprun"};
  Config c;
  std::string b = "8", e = "256M";
  app.add_option("-b,--minbytes", b, "smallest size (8, 64K, 1M...)");
  app.add_option("-e,--maxbytes", e, "largest size");
  app.add_option("-f,--stepfactor", c.factor, "size multiplier between rows")->check(CLI::Range(1.01, 1024.0));
  app.add_option("-o,--op", c.ops, "all_reduce, all_gather, reduce_scatter, broadcast, or a comma list, or all");
  app.add_option("-w,--warmup_iters", c.warmup, "untimed calls per size")->check(CLI::Range(0, 1000));
  app.add_option("-n,--iters", c.max_iters, "most timed calls per size")->check(CLI::Range(1, 1000000));
  app.add_option("--target_ms", c.target_ms, "time to spend per size")->check(CLI::Range(1.0, 60000.0));
  app.add_option("-c,--check", c.check, "check results (1) or not (0)");
  app.add_option("-R,--group_memory", c.group_memory,
                 "buffers from the group's own memory, ProcessGroup::allocate (1) or the heap (0)");
  std::string device = "cpu";
  app.add_option("-d,--device", device, "where the buffers live: cpu (host memory) or cuda (cudaMalloc, GPU local_rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  CLI11_PARSE(app, argc, argv);
  c.cuda = device == "cuda";
#if !DDPRUN_BENCH_CUDA
  if (c.cuda) {
    std::fprintf(stderr, "ddp-bench: --device cuda: this build has no CUDA (configure with -DDDPRUN_WITH_CUDA=ON)\n");
    return 2;
  }
#endif
  if (c.cuda && c.group_memory) {
    std::fprintf(stderr, "ddp-bench: --device cuda and --group_memory 1 exclude each other (group memory is host memory)\n");
    return 2;
  }
  try {
    c.min_bytes = std::max<size_t>(4, parse_size(b));
    c.max_bytes = parse_size(e);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "ddp-bench: %s\n", ex.what());
    return 2;
  }
  if (c.ops == "all") c.ops = "all_reduce,all_gather,reduce_scatter,broadcast";
  std::vector<std::string> ops;
  for (size_t p = 0; p <= c.ops.size();) {
    size_t q = c.ops.find(',', p);
    if (q == std::string::npos) q = c.ops.size();
    ops.push_back(c.ops.substr(p, q - p));
    p = q + 1;
  }
  for (auto& op : ops) {
    if (op != "all_reduce" && op != "all_gather" && op != "reduce_scatter" && op != "broadcast") {
      std::fprintf(stderr, "ddp-bench: unknown op '%s'\n", op.c_str());
      return 2;
    }
  }

  try {
#if DDPRUN_BENCH_CUDA
    // Before init: NCCL takes the current device, and the buffers must live on it.
    if (c.cuda) {
      int devices = 0;
      if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::fprintf(stderr, "ddp-bench: --device cuda: no CUDA device is visible\n");
        return 2;
      }
      const char* lr = std::getenv("LOCAL_RANK");
      const int local = lr ? std::atoi(lr) : 0;
      cuda_check(cudaSetDevice(devices == 1 ? 0 : local % devices), "cudaSetDevice");
    }
#endif
    auto pg = ddp::init();
    if (c.cuda && pg->backend().find("nccl") == std::string::npos) {
      // Every rank got the same group (auto agrees across ranks), so all refuse alike.
      std::fprintf(stderr, "ddp-bench: --device cuda needs the nccl backend, but this job's group is '%s' "
                   "(a node has fewer GPUs than ranks, or DDP_BACKEND says so)\n", pg->backend().c_str());
      return 2;
    }
    const int n = pg->size();
    const bool root = pg->rank() == 0;
    if (root) {
      // Host buffers go to the cpu member of backend cpu+nccl, device buffers to nccl.
      std::printf("# ddp-bench: %d ranks, backend %s, f32 sum, %s buffers%s\n", n, pg->backend().c_str(),
                  c.cuda ? "device (cuda)" : "host", c.group_memory ? " in group memory" : "");
      std::printf("# %-14s %12s %12s %10s %10s %7s\n", "op", "size(B)", "time(us)", "algbw", "busbw", "wrong");
      std::printf("# %-14s %12s %12s %10s %10s %7s\n", "", "", "", "(GB/s)", "(GB/s)", "");
    }
    int wrong_total = 0;
    for (const auto& op : ops) {
      size_t last_bytes = 0;
      for (double sz = static_cast<double>(c.min_bytes); sz <= static_cast<double>(c.max_bytes) * 1.0001; sz *= c.factor) {
        // Round to whole f32 elements, and to a multiple of n for the block ops; sizes
        // that round to the row before (below n * 4 bytes, say) are measured once.
        const size_t unit = (op == "all_gather" || op == "reduce_scatter") ? sizeof(float) * n : sizeof(float);
        const size_t bytes = std::max(unit, static_cast<size_t>(sz) / unit * unit);
        if (bytes == last_bytes) continue;
        last_bytes = bytes;
        Case k(op, *pg, bytes, c.group_memory, c.cuda);
        int wrong = 0;
        if (c.check && !k.correct()) wrong = 1;
        for (int i = 0; i < c.warmup; ++i) k.run();
        // Every rank must run the same number of calls: rank 0 decides from a probe.
        pg->barrier();
        auto t0 = std::chrono::steady_clock::now();
        k.run();
        double probe = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        pg->all_reduce(ddp::view(std::span<double>(&probe, 1)), ddp::ReduceOp::Max);
        int64_t iters = std::clamp<int64_t>(static_cast<int64_t>(c.target_ms / 1e3 / std::max(probe, 1e-7)), 5,
                                            c.max_iters);
        pg->broadcast(ddp::view(std::span<int64_t>(&iters, 1)), 0);
        pg->barrier();
        t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; ++i) k.run();
        double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(iters);
        pg->all_reduce(ddp::view(std::span<double>(&sec, 1)), ddp::ReduceOp::Max);
        int32_t w = wrong;
        pg->all_reduce(ddp::view(std::span<int32_t>(&w, 1)), ddp::ReduceOp::Sum);
        wrong_total += w;
        if (root) {
          const double algbw = static_cast<double>(bytes) / sec / 1e9;
          std::printf("  %-14s %12zu %12.3f %10.3f %10.3f %7d\n", op.c_str(), bytes, sec * 1e6, algbw,
                      algbw * busbw_factor(op, n), w);
          std::fflush(stdout);
        }
      }
    }
    return wrong_total == 0 ? 0 : 1;
  } catch (const ddp::contract::ContractError& ex) {
    std::fprintf(stderr, "ddp-bench: %s\n", ex.what());
    return 2;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "ddp-bench: %s\n", ex.what());
    return 1;
  }
}
