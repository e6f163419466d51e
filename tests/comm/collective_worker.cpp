// collective_worker: a ddp_worker program the collective tests launch (under the
// real ddprun, or as plain processes with torchrun-style variables).
//
//   collective_worker matrix [--big N]   every collective x dtype x op x count
//                                        {0, 1, odd, N}, each compared with a serial
//                                        reference; also async handles and subgroups.
//   collective_worker die <victim>       <victim> kills itself (SIGKILL) while the
//                                        others wait in an all_reduce; they report
//                                        the error and how long it took to see it.
//   collective_worker stuck <victim>     <victim> stops calling collectives (alive);
//                                        the others' all_reduce must time out.
//   collective_worker mismatch <case> <n>  rank 0 makes another call than the others
//   collective_worker mismatch_in_subgroup <case> <n>  the same in group 0.1 of
//                                          global ranks 2 and 3 (4 ranks)
//                                        (all_gather, broadcast, count, dtype, root,
//                                        reduce_op, skip, p2p): all fail with Mismatch.
//   collective_worker sum <bytes>        one f32 all_reduce of <bytes> (traffic a test can
//                                        count on an interface), checked like the matrix
//   collective_worker deadlock           after an all_reduce ranks 0 and 1 recv from each
//                                        other; the others wait in a barrier (stalls forever)
//   collective_worker misuse             bad arguments: refused up front, or (a recv of
//                                        the wrong size) the group breaks everywhere.
// Prints "rank R: ..." lines; exits 0 when every check passed, 1 otherwise.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collective_failures.hpp"
#include "ddp/init.hpp"

namespace {

using ddp::Buffer;
using ddp::DType;
using ddp::ReduceOp;

int g_failures = 0;
int g_checks = 0;
int g_rank = 0;

// ---- values ------------------------------------------------------------------
// Inputs are small integers, so every sum, product, min and max is exact in every
// dtype (f16/bf16 included) whatever the order of operations, and the result can
// be compared bit for bit with a serial reference. They come from a hash of
// (rank, index), not a short cycle: a chunk delivered to the wrong place, or one
// rank's data taken for another's, differs from the reference (a pattern with a
// period of 4 would repeat across chunk boundaries and ranks and hide it).

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int64_t input_value(int rank, size_t i, ReduceOp op) {
  const uint64_t h = mix((static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(i));
  // Prod: 1 or 2, so a product over 8 ranks (<= 256) stays exact in bf16.
  if (op == ReduceOp::Prod) return 1 + static_cast<int64_t>(h % 2);
  return 1 + static_cast<int64_t>(h % 4);
}

void store(DType t, void* base, size_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(base)[i] = v; break;
    case DType::F16: static_cast<ddp::Half*>(base)[i] = ddp::to_half(static_cast<float>(v)); break;
    case DType::BF16: static_cast<ddp::BFloat16*>(base)[i] = ddp::to_bfloat16(static_cast<float>(v)); break;
    case DType::I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DType::I64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::U8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff); break;
  }
}

// The reference result of op over ranks 0..n-1 at element i, stored at out[i].
void reference(DType t, ReduceOp op, int n, size_t i, void* out) {
  int64_t acc = input_value(0, i, op);
  for (int r = 1; r < n; ++r) {
    const int64_t v = input_value(r, i, op);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  if (op != ReduceOp::Avg) return store(t, out, i, static_cast<double>(acc));
  // Avg: the exact sum in the dtype, divided once in the dtype's arithmetic.
  switch (t) {
    case DType::F32: static_cast<float*>(out)[i] = static_cast<float>(acc) / static_cast<float>(n); break;
    case DType::F64: static_cast<double*>(out)[i] = static_cast<double>(acc) / n; break;
    case DType::F16: static_cast<ddp::Half*>(out)[i] = ddp::to_half(static_cast<float>(acc) / static_cast<float>(n)); break;
    case DType::BF16: static_cast<ddp::BFloat16*>(out)[i] = ddp::to_bfloat16(static_cast<float>(acc) / static_cast<float>(n)); break;
    default: store(t, out, i, static_cast<double>(acc / n)); break;
  }
}

struct Vec {
  DType t;
  std::vector<std::byte> bytes;
  Vec(DType type, size_t count) : t(type), bytes(count * ddp::dtype_size(type)) {}
  size_t count() const { return bytes.size() / ddp::dtype_size(t); }
  Buffer buf() { return Buffer{bytes.data(), count(), t}; }
  void* at(size_t i) { return bytes.data() + i * ddp::dtype_size(t); }
};

// The input rank r gives: n_blocks blocks of `count` elements; element i of the
// whole vector is input_value(r, i).
Vec make_input(DType t, ReduceOp op, int r, size_t count) {
  Vec v(t, count);
  for (size_t i = 0; i < count; ++i) store(t, v.bytes.data(), i, static_cast<double>(input_value(r, i, op)));
  return v;
}

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    if (g_failures <= 20) std::printf("rank %d: FAILED %s\n", g_rank, what.c_str());
  }
}

std::string label(const char* coll, DType t, ReduceOp op, size_t count, bool with_op = true) {
  std::string s = std::string(coll) + " " + ddp::dtype_name(t) + " count " + std::to_string(count);
  if (with_op) s += std::string(" ") + ddp::reduce_op_name(op);
  return s;
}

// ---- the matrix ------------------------------------------------------------

// Where the matrix puts buffers in the group's own memory: not at its start, so
// peers must translate addresses, not just bases.
constexpr size_t kMemoryOffset = 192;

void reducing(ddp::ProcessGroup& pg, ddp::GroupMemory& memory, DType t, ReduceOp op, size_t c) {
  const int n = pg.size(), r = pg.rank();
  Vec want(t, c * static_cast<size_t>(n));
  for (size_t i = 0; i < want.count(); ++i) reference(t, op, n, i, want.bytes.data());
  const size_t esz = ddp::dtype_size(t);
  {  // all_reduce
    Vec v = make_input(t, op, r, c);
    pg.all_reduce(v.buf(), op);
    check(std::memcmp(v.bytes.data(), want.bytes.data(), c * esz) == 0, label("all_reduce", t, op, c));
  }
  {  // all_reduce on the group's memory (shared by the host's ranks where possible)
    Vec v = make_input(t, op, r, c);
    Buffer b{memory.data() + kMemoryOffset, c, t};
    if (c > 0) std::memcpy(b.data, v.bytes.data(), c * esz);
    pg.all_reduce(b, op);
    check(c == 0 || std::memcmp(b.data, want.bytes.data(), c * esz) == 0, label("all_reduce in group memory", t, op, c));
  }
  {  // reduce to the last rank; the others keep their input
    const int root = n - 1;
    Vec v = make_input(t, op, r, c);
    Vec orig = v;
    pg.reduce(v.buf(), root, op);
    const Vec& expect = r == root ? want : orig;
    check(std::memcmp(v.bytes.data(), expect.bytes.data(), c * esz) == 0, label("reduce", t, op, c));
  }
  {  // reduce_scatter: block r of the reduction
    Vec in = make_input(t, op, r, c * static_cast<size_t>(n));
    Vec out(t, c);
    pg.reduce_scatter(in.buf(), out.buf(), op);
    check(std::memcmp(out.bytes.data(), want.at(c * static_cast<size_t>(r)), c * esz) == 0,
          label("reduce_scatter", t, op, c));
  }
}

void moving(ddp::ProcessGroup& pg, DType t, size_t c) {
  const int n = pg.size(), r = pg.rank();
  const auto N = static_cast<size_t>(n);
  const ReduceOp op = ReduceOp::Sum;  // inputs only
  const size_t esz = ddp::dtype_size(t);
  auto all_inputs = [&](size_t per_rank) {  // every rank's input, concatenated in rank order
    Vec v(t, per_rank * N);
    for (int q = 0; q < n; ++q) {
      Vec in = make_input(t, op, q, per_rank);
      std::memcpy(v.at(per_rank * static_cast<size_t>(q)), in.bytes.data(), in.bytes.size());
    }
    return v;
  };
  {  // broadcast from rank 1 (or 0)
    const int root = 1 % n;
    Vec v = r == root ? make_input(t, op, root, c) : Vec(t, c);
    pg.broadcast(v.buf(), root);
    check(v.bytes == make_input(t, op, root, c).bytes, label("broadcast", t, op, c, false));
  }
  {  // all_gather
    Vec in = make_input(t, op, r, c), out(t, c * N);
    pg.all_gather(in.buf(), out.buf());
    check(out.bytes == all_inputs(c).bytes, label("all_gather", t, op, c, false));
  }
  {  // gather to rank 0
    Vec in = make_input(t, op, r, c), out(t, r == 0 ? c * N : 0);
    pg.gather(in.buf(), out.buf(), 0);
    if (r == 0) check(out.bytes == all_inputs(c).bytes, label("gather", t, op, c, false));
  }
  {  // scatter from the last rank: block q of its input goes to rank q
    const int root = n - 1;
    Vec in = r == root ? make_input(t, op, root, c * N) : Vec(t, 0);
    Vec out(t, c);
    pg.scatter(in.buf(), out.buf(), root);
    Vec full = make_input(t, op, root, c * N);
    check(std::memcmp(out.bytes.data(), full.at(c * static_cast<size_t>(r)), c * esz) == 0,
          label("scatter", t, op, c, false));
  }
  {  // all_to_all: block j of rank i's input lands in block i of rank j's output
    Vec in = make_input(t, op, r, c * N), out(t, c * N);
    pg.all_to_all(in.buf(), out.buf());
    bool ok = true;
    for (int q = 0; q < n && ok; ++q) {
      Vec theirs = make_input(t, op, q, c * N);
      ok = std::memcmp(out.at(c * static_cast<size_t>(q)), theirs.at(c * static_cast<size_t>(r)), c * esz) == 0;
    }
    check(ok, label("all_to_all", t, op, c, false));
  }
  if (n > 1) {  // send/recv around the ring (even ranks send first: no cycle of large sends)
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    Vec out = make_input(t, op, r, c), in(t, c);
    if (r % 2 == 0) {
      pg.send(out.buf(), right);
      pg.recv(in.buf(), left);
    } else {
      pg.recv(in.buf(), left);
      pg.send(out.buf(), right);
    }
    check(in.bytes == make_input(t, op, left, c).bytes, label("send/recv", t, op, c, false));
  }
  pg.barrier();
}

void async_and_subgroups(ddp::ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  // Several async all-reduces in flight, waited in reverse order.
  std::vector<Vec> bufs;
  for (int k = 0; k < 4; ++k) bufs.push_back(make_input(DType::F32, ReduceOp::Sum, r, 1000 + static_cast<size_t>(k) * 5000));
  std::vector<ddp::Work> works;
  for (auto& b : bufs) works.push_back(pg.all_reduce(b.buf(), ReduceOp::Sum, {.async_op = true}));
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait(std::chrono::seconds(60));
  for (auto& b : bufs) {
    Vec want(DType::F32, b.count());
    for (size_t i = 0; i < b.count(); ++i) reference(DType::F32, ReduceOp::Sum, n, i, want.bytes.data());
    check(b.bytes == want.bytes, "async all_reduce count " + std::to_string(b.count()));
  }
  check(works.front().is_completed(), "async work completed");
  // A subgroup of the even ranks; odd ranks get none.
  std::vector<int> evens;
  for (int q = 0; q < n; q += 2) evens.push_back(q);
  auto sub = pg.new_group(evens);
  check((sub != nullptr) == (r % 2 == 0), "new_group membership");
  if (sub) {
    check(sub->rank() == r / 2 && sub->size() == static_cast<int>(evens.size()), "subgroup rank and size");
    int64_t v = r, want = 0;
    for (int q : evens) want += q;
    sub->all_reduce(ddp::view(std::span<int64_t>(&v, 1)), ReduceOp::Sum);
    check(v == want, "subgroup all_reduce");
  }
  // A subgroup without rank 0, listed backwards: the odd ranks, highest first. Its
  // rank i is odds[i], whatever the order of the parent's ranks.
  if (n >= 2) {
    std::vector<int> odds;
    for (int q = n - 1; q >= 1; --q)
      if (q % 2 == 1) odds.push_back(q);
    auto rev = pg.new_group(odds);
    check((rev != nullptr) == (r % 2 == 1), "new_group without rank 0: membership");
    if (rev) {
      const auto me = std::find(odds.begin(), odds.end(), r) - odds.begin();
      check(rev->rank() == me && rev->size() == static_cast<int>(odds.size()), "reversed subgroup rank and size");
      int64_t mine = r;
      std::vector<int64_t> all(odds.size(), -1);
      rev->all_gather(ddp::view(std::span<int64_t>(&mine, 1)), ddp::view(all));
      check(std::equal(all.begin(), all.end(), odds.begin()), "reversed subgroup all_gather in subgroup rank order");
      int64_t b = r;
      rev->broadcast(ddp::view(std::span<int64_t>(&b, 1)), 0);
      check(b == odds.front(), "reversed subgroup broadcast from its rank 0");
    }
  }
  pg.barrier();
}

// Group memory: zero-filled, freed and allocated again (peers then drop their view
// of the freed one), and an async all-reduce in it. Returns whether it was shared.
bool group_memory(ddp::ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  auto first = pg.allocate(4096);
  auto second = pg.allocate((1 << 20) + 3);
  bool zero = true;
  for (size_t i = 0; i < second->bytes(); ++i) zero &= second->data()[i] == std::byte{0};
  check(zero && second->bytes() == (1 << 20) + 3, "allocate: zero-filled, of the size asked");
  check(first->shared() == second->shared(), "allocate: the same answer each time");
  first.reset();
  auto third = pg.allocate(3 << 20);
  check(third->shared() == second->shared(), "allocate after a free");
  for (auto* memory : {second.get(), third.get()}) {
    const size_t count = memory->bytes() / sizeof(float) - 1;
    Vec v = make_input(DType::F32, ReduceOp::Sum, r, count);
    Buffer b{memory->data() + sizeof(float), count, DType::F32};
    std::memcpy(b.data, v.bytes.data(), v.bytes.size());
    pg.all_reduce(b, ReduceOp::Sum, {.async_op = true}).wait(std::chrono::seconds(60));
    Vec want(DType::F32, count);
    for (size_t i = 0; i < count; ++i) reference(DType::F32, ReduceOp::Sum, n, i, want.bytes.data());
    check(std::memcmp(b.data, want.bytes.data(), want.bytes.size()) == 0,
          "async all_reduce in group memory count " + std::to_string(count));
  }
  return third->shared();
}

int matrix(ddp::ProcessGroup& pg, size_t big) {
  const DType types[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod};
  const size_t counts[] = {0, 1, 1001, big};
  auto memory = pg.allocate(kMemoryOffset + big * sizeof(double));
  for (size_t c : counts) {
    for (DType t : types) {
      for (ReduceOp op : ops) reducing(pg, *memory, t, op, c);
      moving(pg, t, c);
    }
  }
  async_and_subgroups(pg);
  const bool shared = group_memory(pg);
  check(shared == memory->shared(), "every allocate gives the same answer");
  std::printf("rank %d: group memory shared=%d\n", pg.rank(), shared ? 1 : 0);
  std::printf("rank %d: %d checks, %d failed\n", pg.rank(), g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

int sum(ddp::ProcessGroup& pg, size_t bytes) {
  const size_t count = bytes / sizeof(float);
  Vec v = make_input(DType::F32, ReduceOp::Sum, pg.rank(), count);
  pg.all_reduce(v.buf(), ReduceOp::Sum);
  Vec want(DType::F32, count);
  for (size_t i = 0; i < count; ++i) reference(DType::F32, ReduceOp::Sum, pg.size(), i, want.bytes.data());
  check(v.bytes == want.bytes, "all_reduce of " + std::to_string(bytes) + " bytes");
  std::printf("rank %d: %d checks, %d failed\n", pg.rank(), g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "matrix";
  try {
    auto pg = ddp::init();
    g_rank = pg->rank();
    if (mode == "matrix") {
      size_t big = 1 << 20;
      if (argc > 3 && std::string(argv[2]) == "--big") big = std::strtoull(argv[3], nullptr, 10);
      // The group memory is sized for the largest count; 1001 is always in the matrix.
      if (big < 1001) {
        std::fprintf(stderr, "collective_worker: --big must be at least 1001 (got %s)\n", argv[3]);
        return 2;
      }
      return matrix(*pg, big);
    }
    if (mode == "die" && argc > 2) return collective_failures::die(*pg, std::atoi(argv[2]));
    if (mode == "stuck" && argc > 2) return collective_failures::stuck(*pg, std::atoi(argv[2]));
    if (mode == "sum" && argc > 2) return sum(*pg, std::strtoull(argv[2], nullptr, 10));
    if (mode == "misuse") return collective_failures::misuse(*pg);
    if (mode == "deadlock") return collective_failures::deadlock(*pg);
    if (mode == "disagree") return collective_failures::disagree(*pg);
    if (mode == "mismatch" && argc > 3) {
      return collective_failures::mismatch(*pg, argv[2], std::strtoull(argv[3], nullptr, 10), g_rank);
    }
    if (mode == "mismatch_in_subgroup" && argc > 3) {
      return collective_failures::mismatch_in_subgroup(*pg, argv[2], std::strtoull(argv[3], nullptr, 10), g_rank);
    }
    std::fprintf(stderr, "usage: collective_worker matrix [--big N] | sum <bytes> | die <rank> | stuck <rank> | deadlock | misuse | disagree | "
                 "mismatch[_in_subgroup] <case> <count>\n");
    return 2;
  } catch (const ddp::contract::ContractError& e) {
    std::fprintf(stderr, "collective_worker: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_worker: rank %d: %s\n", g_rank, e.what());
    return 1;
  }
}
