// The widening reduce_scatter (bf16/f16 input, f32 output, as bf16 gradient
// communication uses it) on the real CPU backend, ranks forked over a real store: every
// element is the rank-order f32 sum of the 16-bit inputs, bit for bit, computed here
// by hand (through plain buffers, which the ranks exchange, and through group memory,
// which they read in place); Avg divides that sum in f32; count 0 and one rank work;
// only 16-bit float input with f32 output and Sum/Avg is accepted; ranks that pass
// other dtypes are reported as a mismatch naming both sides.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "forked_group.hpp"
#include "recording_backend.hpp"

using namespace std::chrono_literals;
using ddp::Buffer;
using ddp::Device;
using ddp::DType;
using testing::on_ranks;
using testing::sorted_lines;

namespace {

// Rank r's input element i: magnitudes from 1e-3 to 1e4 and both signs, so that the
// order of the f32 additions changes the result (a fold in another order would show).
float input_value(int rank, size_t i) {
  const uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>(rank * 40503u + 7u);
  const float mantissa = static_cast<float>(h % 1000u) / 1000.0f + 0.5f;
  const float scale = (h >> 10) % 8u == 0 ? 1e4f : ((h >> 13) % 2u ? 1e-3f : 1.0f);
  return ((h >> 16) & 1u ? -mantissa : mantissa) * scale;
}

std::vector<uint16_t> rank_input(int rank, size_t count, DType dtype) {
  std::vector<uint16_t> in(count);
  for (size_t i = 0; i < count; ++i) {
    in[i] = dtype == DType::BF16 ? ddp::to_bfloat16(input_value(rank, i)).bits : ddp::to_half(input_value(rank, i)).bits;
  }
  return in;
}

float widen(DType dtype, uint16_t bits) {
  return dtype == DType::BF16 ? ddp::to_float(ddp::BFloat16{bits}) : ddp::to_float(ddp::Half{bits});
}

// Rank `me`'s output by hand: block `me` of every rank's input, summed in f32 in rank order.
std::vector<float> expected(int n, int me, size_t block, DType dtype, ddp::ReduceOp op) {
  std::vector<std::vector<uint16_t>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(rank_input(r, block * static_cast<size_t>(n), dtype));
  std::vector<float> out(block);
  for (size_t i = 0; i < block; ++i) {
    float s = widen(dtype, inputs[0][block * static_cast<size_t>(me) + i]);
    for (int r = 1; r < n; ++r) s += widen(dtype, inputs[static_cast<size_t>(r)][block * static_cast<size_t>(me) + i]);
    out[i] = op == ddp::ReduceOp::Avg ? s / static_cast<float>(n) : s;
  }
  return out;
}

// Runs the widening reduce_scatter once per (dtype, op, memory kind) and reports, per
// case, how many output elements differ in their bits from `expected`.
std::string bit_exact_report(ddp::ProcessGroup& pg, size_t block) {
  const int n = pg.size();
  std::string out;
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (ddp::ReduceOp op : {ddp::ReduceOp::Sum, ddp::ReduceOp::Avg}) {
      for (bool shared : {false, true}) {
        const auto mine = rank_input(pg.rank(), block * static_cast<size_t>(n), dtype);
        std::vector<uint16_t> plain = mine;
        std::unique_ptr<ddp::GroupMemory> memory = pg.allocate(std::max<size_t>(1, mine.size()) * 2);
        // The "shared" cases test the in-place path: peer memory is permitted here and in
        // CI (root), so plain memory would be a setup fault, not a pass (alone, a rank has
        // no peers to share with).
        if (shared && pg.size() > 1 && !memory->shared()) {
          throw ddp::Error("allocate() gave memory the peers cannot reach: the shared case would test nothing");
        }
        void* input = shared ? static_cast<void*>(memory->data()) : plain.data();
        if (shared && !mine.empty()) std::memcpy(input, mine.data(), mine.size() * 2);
        std::vector<float> got(block, -1.0f);
        pg.reduce_scatter(Buffer{input, mine.size(), dtype, Device::Cpu}, ddp::view(got), op);
        const auto want = expected(n, pg.rank(), block, dtype, op);
        size_t wrong = 0;
        for (size_t i = 0; i < block; ++i) wrong += std::memcmp(&got[i], &want[i], sizeof(float)) != 0 ? 1 : 0;
        out += std::string(ddp::dtype_name(dtype)) + " " + ddp::reduce_op_name(op) + (shared ? " shared" : " plain") +
               ": " + std::to_string(wrong) + " wrong\n";
      }
    }
  }
  return out;
}

std::string all_right() {
  std::string out;
  for (const char* d : {"bf16", "f16"})
    for (const char* op : {"sum", "avg"})
      for (const char* m : {" shared", " plain"}) out += std::string(d) + " " + op + m + ": 0 wrong\n";
  return out;
}

}  // namespace

TEST_CASE("widening reduce_scatter, 3 ranks: the rank-order f32 sum of the 16-bit inputs, bit for bit", "[widening]") {
  // 70000 elements a block: several of the fold's pieces, and a tail.
  for (size_t block : {size_t{5}, size_t{70000}}) {
    INFO("block " << block);
    const auto reports = on_ranks(3, [block](ddp::ProcessGroup& pg) { return bit_exact_report(pg, block); });
    for (const auto& r : reports) CHECK(sorted_lines(r) == sorted_lines(all_right()));
  }
}

TEST_CASE("widening reduce_scatter, 2 ranks and 1 rank: exact too and count 0 is a no-op", "[widening]") {
  for (int n : {1, 2}) {
    INFO(n << " rank(s)");
    const auto reports = on_ranks(n, [](ddp::ProcessGroup& pg) {
      std::string out = bit_exact_report(pg, 1000);
      float untouched = 42.0f;
      pg.reduce_scatter(Buffer{nullptr, 0, DType::BF16, Device::Cpu}, Buffer{&untouched, 0, DType::F32, Device::Cpu},
                        ddp::ReduceOp::Avg);
      // The group is still in step after the empty call.
      std::vector<float> v(4, 1.0f);
      pg.all_reduce(ddp::view(v));
      return out + "count 0: " + std::to_string(untouched) + " then " + std::to_string(v[0]) + "\n";
    });
    for (const auto& r : reports) {
      CHECK(sorted_lines(r) == sorted_lines(all_right() + "count 0: 42.000000 then " + std::to_string(float(n)) + "\n"));
    }
  }
}

TEST_CASE("only bf16 or f16 input with f32 output and sum or avg may mix dtypes", "[widening][args]") {
  std::vector<uint16_t> half(8);
  std::vector<float> f(8);
  std::vector<double> d(4);
  const Buffer bf16{half.data(), 8, DType::BF16, Device::Cpu}, f16{half.data(), 8, DType::F16, Device::Cpu};
  const Buffer f32_out{f.data(), 4, DType::F32, Device::Cpu}, f64_out{d.data(), 4, DType::F64, Device::Cpu};
  // Groups whose backend records what reaches it (nothing should, when refused).
  std::shared_ptr<std::vector<std::string>> host_calls, gpu_calls;
  auto host_group = testing::recording_group("recording", 0, 2, ddp::detail::Reach::Host, &host_calls);
  auto& host = *host_group;
  host.reduce_scatter(bf16, f32_out, ddp::ReduceOp::Avg);
  host.reduce_scatter(f16, f32_out, ddp::ReduceOp::Sum);
  CHECK(host_calls->size() == 2);
  CHECK_THROWS_WITH(host.reduce_scatter(bf16, f64_out),
                    "reduce_scatter: input is bf16 but output is f64 (only bf16 or f16 input with f32 output may differ)");
  CHECK_THROWS_WITH(host.reduce_scatter(Buffer{f.data(), 8, DType::F32, Device::Cpu}, Buffer{half.data(), 4, DType::BF16, Device::Cpu}),
                    "reduce_scatter: input is f32 but output is bf16 (only bf16 or f16 input with f32 output may differ)");
  CHECK_THROWS_WITH(host.reduce_scatter(bf16, f32_out, ddp::ReduceOp::Max),
                    "reduce_scatter: bf16\u2192f32 reduce_scatter supports sum and avg only, not max");
  CHECK_THROWS_WITH(host.reduce_scatter(bf16, Buffer{f.data(), 3, DType::F32, Device::Cpu}),
                    "reduce_scatter: input holds 8 elements, expected 2 x 3");
  // Other collectives never mix dtypes.
  CHECK_THROWS_WITH(host.all_gather(Buffer{half.data(), 4, DType::BF16, Device::Cpu}, f32_out),
                    "all_gather: input is bf16 but output is f32");
  CHECK(host_calls->size() == 2);
  // GPU groups (NCCL) have no widening reduce-scatter: named, whatever the memory.
  auto gpu_group = testing::recording_group("recording", 0, 2, ddp::detail::Reach::Gpu, &gpu_calls);
  auto& gpu = *gpu_group;
  CHECK_THROWS_WITH(gpu.reduce_scatter(bf16, f32_out), "reduce_scatter: bf16\u2192f32 reduce_scatter: host buffers only");
  CHECK_THROWS_WITH(gpu.reduce_scatter(Buffer{half.data(), 8, DType::BF16, Device::Cuda},
                                       Buffer{f.data(), 4, DType::F32, Device::Cuda}),
                    "reduce_scatter: bf16\u2192f32 reduce_scatter: host buffers only");
  CHECK(gpu_calls->empty());
  // The description names both dtypes.
  ddp::detail::Op op{ddp::detail::OpKind::ReduceScatter, Buffer{nullptr, 1024, DType::BF16},
                     Buffer{nullptr, 512, DType::F32}, -1, ddp::ReduceOp::Avg, {}};
  CHECK(ddp::detail::describe_op(op) == "reduce_scatter 1024\u00d7bf16\u2192f32 avg");
}

TEST_CASE("ranks passing f32 against bf16 to reduce_scatter are a mismatch naming both", "[widening][failure]") {
  // Rank 1 passes bf16 -> f32; rank 0 f32 -> f32 (the input differs), or bf16 -> bf16
  // (only the output differs: the stamp carries both dtypes).
  struct Variant {
    DType in, out;
    const char* rank0;
  };
  for (const Variant& v : {Variant{DType::F32, DType::F32, "reduce_scatter #1 2000\u00d7f32 sum"},
                           Variant{DType::BF16, DType::BF16, "reduce_scatter #1 2000\u00d7bf16 sum"}}) {
    INFO(v.rank0);
    const auto reports = on_ranks(2, [v](ddp::ProcessGroup& pg) {
      std::vector<float> f32_in(2000, 1.0f), f32_out(1000);
      std::vector<uint16_t> bf_in(2000, ddp::to_bfloat16(1.0f).bits), bf_out(1000);
      const bool odd = pg.rank() == 0;
      const Buffer bf16_in{bf_in.data(), 2000, DType::BF16, Device::Cpu};
      const Buffer in = odd && v.in == DType::F32 ? ddp::view(f32_in) : bf16_in;
      const Buffer out = odd && v.out == DType::BF16 ? Buffer{bf_out.data(), 1000, DType::BF16, Device::Cpu} : ddp::view(f32_out);
      try {
        pg.reduce_scatter(in, out, ddp::ReduceOp::Sum, {.timeout = 10s});
        return std::string("returned");
      } catch (const ddp::Mismatch& e) {
        return std::string("Mismatch: ") + e.what();
      } catch (const std::exception& e) {
        return std::string("other error: ") + e.what();
      }
    });
    for (const auto& r : reports) {
      INFO(r);
      CHECK(r.find("Mismatch: ") == 0);
      CHECK(r.find(v.rank0) != std::string::npos);
      CHECK(r.find("reduce_scatter #1 2000\u00d7bf16\u2192f32 sum") != std::string::npos);
    }
  }
}
