// One-host reductions fold in rank order, and the direct reduce_scatter and all_gather
// (ranks reading the peers' group memory) on the real CPU backend, ranks forked over a
// real store:
//   - with values where the order of f32 additions changes the result (1e8, 1, -1e8
//     rotated over the ranks), all_reduce (direct, staged and small paths) and
//     reduce_scatter on group memory give, bit for bit, the rank-order f32 fold
//     computed here by hand: so a reduce-scattered block equals the same slice of an
//     all-reduced buffer (DDP's bucket against ZeRO-1's and FSDP's shards);
//   - reduce_scatter in place (output = block rank() of the input) is the same;
//     reduce_scatter on plain memory (the ring) still sums exactly representable values;
//   - all_gather on group memory in place and not in place, and on plain memory (the
//     ring), repeated with every rank rewriting its block as soon as a call returns (a
//     peer still reading it would see the next round's values);
//   - block sizes that are not multiples of the fold's piece, and 2 and 3 ranks.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "forked_group.hpp"

using ddp::Buffer;
using ddp::Device;
using ddp::DType;
using ddp::ReduceOp;
using testing::on_ranks;
using testing::sorted_lines;

namespace {

// 2 pieces of the fold (8192 f32) and a tail.
constexpr size_t kBlock = 2 * 8192 + 37;

// Rank r's element i: 1e8, 1 and -1e8 rotated over the ranks (scaled a little per
// element), so (1e8 + 1) - 1e8 = 0 but (1e8 - 1e8) + 1 = 1 in f32: any fold order other
// than rank order shows.
float order_value(int rank, size_t i) {
  static const float kPattern[3] = {1e8f, 1.0f, -1e8f};
  return kPattern[(static_cast<size_t>(rank) + i) % 3] * (1.0f + static_cast<float>(i % 7) / 8.0f);
}

// Small integers: every order of addition gives the same exact sum.
float exact_value(int rank, size_t i) { return static_cast<float>((static_cast<size_t>(rank) * 31 + i) % 1000); }

float fold(ReduceOp op, float a, float b) {
  if (op == ReduceOp::Max) return a > b ? a : b;
  return a + b;
}

// Element i of the reduction over n ranks by hand: rank order, f32, ÷n for Avg.
float rank_order(int n, size_t i, ReduceOp op, float (*value)(int, size_t)) {
  float s = value(0, i);
  for (int r = 1; r < n; ++r) s = fold(op, s, value(r, i));
  return op == ReduceOp::Avg ? s / static_cast<float>(n) : s;
}

size_t wrong_bits(const float* got, size_t count, size_t first, int n, ReduceOp op, float (*value)(int, size_t)) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = rank_order(n, first + i, op, value);
    wrong += std::memcmp(&got[i], &want, sizeof(float)) != 0 ? 1 : 0;
  }
  return wrong;
}

// A buffer of `count` floats: group memory (ProcessGroup::allocate) or the heap.
struct Floats {
  std::unique_ptr<ddp::GroupMemory> memory;
  std::vector<float> heap;
  float* data = nullptr;
  size_t count = 0;
  Floats(ddp::ProcessGroup& pg, size_t n, bool shared) : count(n) {
    if (shared) {
      memory = pg.allocate(std::max<size_t>(1, n) * sizeof(float));
      // The group-memory cases test the direct paths: peer memory is permitted here and
      // in CI (root), so plain memory would be a setup fault, not a pass.
      if (!memory->shared()) {
        throw ddp::Error("allocate() gave memory the peers cannot reach: the group-memory case would test nothing");
      }
      data = reinterpret_cast<float*>(memory->data());
    } else {
      heap.resize(n);
      data = heap.data();
    }
  }
  Buffer buffer() const { return Buffer{data, count, DType::F32, Device::Cpu}; }
  Buffer block(size_t b, size_t len) const { return Buffer{data + b * len, len, DType::F32, Device::Cpu}; }
  void fill(int rank, float (*value)(int, size_t)) {
    for (size_t i = 0; i < count; ++i) data[i] = value(rank, i);
  }
};

std::string line(const std::string& what, size_t wrong) { return what + ": " + std::to_string(wrong) + " wrong\n"; }

// Every reduction case on this rank: how many elements differ, in their bits, from the
// rank-order fold.
std::string reduction_report(ddp::ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  const size_t total = kBlock * static_cast<size_t>(n);
  std::string out;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    const std::string name = ddp::reduce_op_name(op);
    // all_reduce: direct on group memory; on the heap staged (< 1 MiB) or through
    // process_vm_readv/writev; and the small exchange.
    for (bool shared : {true, false}) {
      Floats all(pg, total, shared);
      all.fill(me, order_value);
      pg.all_reduce(all.buffer(), op);
      out += line(name + (shared ? " all_reduce group memory" : " all_reduce heap"), wrong_bits(all.data, total, 0, n, op, order_value));
      // reduce_scatter of the same inputs: block rank() of that all-reduce, bit for bit.
      if (!shared) continue;
      Floats in(pg, total, true);
      in.fill(me, order_value);
      std::vector<float> got(kBlock, -1.0f);
      pg.reduce_scatter(in.buffer(), ddp::view(got), op);
      out += line(name + " reduce_scatter group memory", wrong_bits(got.data(), kBlock, kBlock * static_cast<size_t>(me), n, op, order_value));
      out += line(name + " reduce_scatter == all_reduce's block",
                  std::memcmp(got.data(), all.data + kBlock * static_cast<size_t>(me), kBlock * sizeof(float)) != 0 ? 1 : 0);
      // In place: the output is block rank() of the input, which the peers do not read.
      pg.reduce_scatter(in.buffer(), in.block(static_cast<size_t>(me), kBlock), op);
      out += line(name + " reduce_scatter in place", wrong_bits(in.data + kBlock * static_cast<size_t>(me), kBlock,
                                                                kBlock * static_cast<size_t>(me), n, op, order_value));
    }
    Floats small(pg, 64, false);
    small.fill(me, order_value);
    pg.all_reduce(small.buffer(), op);
    out += line(name + " all_reduce small", wrong_bits(small.data, 64, 0, n, op, order_value));
    // The ring (plain memory): exact values only, its fold order is its own.
    Floats plain(pg, total, false);
    plain.fill(me, exact_value);
    std::vector<float> got(kBlock, -1.0f);
    pg.reduce_scatter(plain.buffer(), ddp::view(got), op);
    out += line(name + " reduce_scatter heap", wrong_bits(got.data(), kBlock, kBlock * static_cast<size_t>(me), n, op, exact_value));
  }
  return out;
}

std::string no_reduction_wrong() {
  std::string out;
  for (const char* op : {"sum", "avg", "max"}) {
    for (const char* c : {" all_reduce group memory", " all_reduce heap", " reduce_scatter group memory",
                          " reduce_scatter == all_reduce's block", " reduce_scatter in place", " all_reduce small",
                          " reduce_scatter heap"})
      out += line(std::string(op) + c, 0);
  }
  return out;
}

// Round k's value of rank r's block, element i.
// (Below 2^24: every value exact and distinct per round and rank.)
float gathered_value(int round, int rank, size_t i) {
  return static_cast<float>(static_cast<size_t>(round) * 100003 + static_cast<size_t>(rank) * 20011 + i % 4099);
}

std::string gather_report(ddp::ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  constexpr int kRounds = 20;
  std::string out;
  struct Variant {
    const char* name;
    bool shared_out, in_place;
  };
  for (const Variant v : {Variant{"all_gather group memory in place", true, true},
                          Variant{"all_gather group memory", true, false}, Variant{"all_gather heap", false, false}}) {
    Floats output(pg, kBlock * static_cast<size_t>(n), v.shared_out);
    std::vector<float> separate(kBlock);
    float* mine = v.in_place ? output.data + kBlock * static_cast<size_t>(me) : separate.data();
    size_t wrong = 0;
    for (int round = 0; round < kRounds; ++round) {
      // Written as soon as the previous call returned: a peer still reading this block
      // would gather this round's values into the previous round.
      for (size_t i = 0; i < kBlock; ++i) mine[i] = gathered_value(round, me, i);
      pg.all_gather(Buffer{mine, kBlock, DType::F32, Device::Cpu}, output.buffer());
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < kBlock; ++i) wrong += output.data[kBlock * static_cast<size_t>(r) + i] != gathered_value(round, r, i);
    }
    out += line(v.name, wrong);
  }
  return out;
}

}  // namespace

TEST_CASE("one-host reductions fold in rank order: all_reduce and reduce_scatter give the same bits", "[direct]") {
  for (int n : {2, 3}) {
    INFO(n << " ranks");
    const auto reports = on_ranks(n, reduction_report);
    for (const auto& r : reports) CHECK(sorted_lines(r) == sorted_lines(no_reduction_wrong()));
  }
}

TEST_CASE("all_gather in group memory, in place or not, and on the heap, round after round", "[direct]") {
  for (int n : {2, 3}) {
    INFO(n << " ranks");
    const auto reports = on_ranks(n, gather_report);
    for (const auto& r : reports) {
      CHECK(sorted_lines(r) == sorted_lines(line("all_gather group memory in place", 0) + line("all_gather group memory", 0) +
                                            line("all_gather heap", 0)));
    }
  }
}
