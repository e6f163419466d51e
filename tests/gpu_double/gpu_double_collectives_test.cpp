// The NCCL double's collectives over forked processes: every collective x every
// type x every op with exact expected values, in place and not (all_reduce,
// reduce_scatter, broadcast, all_gather), a non-root reduce leaving its receive
// buffer alone, and a buffer far larger than the segment's channels.
#include <cmath>
#include <cstdint>

#include "double_test_support.hpp"

using namespace gpu_double_test;

namespace {

constexpr size_t kCount = 1031;  // elements per rank: odd, not a multiple of anything

// Every type with its size in bytes, written out here rather than asked of the double.
const std::pair<ncclDataType_t, size_t> kTypeSizes[] = {
    {ncclInt8, 1},    {ncclUint8, 1},   {ncclInt32, 4},   {ncclUint32, 4},   {ncclInt64, 8},
    {ncclUint64, 8},  {ncclFloat16, 2}, {ncclBfloat16, 2}, {ncclFloat32, 4}, {ncclFloat64, 8}};
const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

size_t size_of(ncclDataType_t t) {
  for (const auto& [type, size] : kTypeSizes)
    if (type == t) return size;
  throw std::logic_error("no such type");
}

bool is_float(ncclDataType_t t) { return t >= ncclFloat16 && t <= ncclBfloat16; }

// The bytes of `v` (a small integer or an exact binary fraction) stored as `t`.
std::vector<uint8_t> encode(ncclDataType_t t, double v) {
  std::vector<uint8_t> out(size_of(t));
  auto put = [&](auto x) { std::memcpy(out.data(), &x, sizeof(x)); };
  const float f = static_cast<float>(v);
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof(bits));
  switch (t) {
    case ncclInt8: put(static_cast<int8_t>(static_cast<int64_t>(v))); break;
    case ncclUint8: put(static_cast<uint8_t>(static_cast<int64_t>(v))); break;
    case ncclInt32: put(static_cast<int32_t>(static_cast<int64_t>(v))); break;
    case ncclUint32: put(static_cast<uint32_t>(static_cast<int64_t>(v))); break;
    case ncclInt64: put(static_cast<int64_t>(v)); break;
    case ncclUint64: put(static_cast<uint64_t>(static_cast<int64_t>(v))); break;
    case ncclFloat32: put(f); break;
    case ncclFloat64: put(v); break;
    case ncclBfloat16: put(static_cast<uint16_t>(bits >> 16)); break;  // exact values only
    case ncclFloat16: {
      // Exact normal values only: rebias the exponent, keep the top 10 mantissa bits.
      const uint32_t sign = (bits >> 16) & 0x8000;
      const uint32_t exp = (bits >> 23) & 0xff;
      const uint32_t h = f == 0 ? sign : sign | ((exp - 112) << 10) | ((bits >> 13) & 0x3ff);
      put(static_cast<uint16_t>(h));
      break;
    }
    default: break;
  }
  return out;
}

// Rank r's element i: (r + 1) * k with k = 1 + i % 4, so every result is exact in
// every type: sum k n(n+1)/2, prod k^n n!, max n k, min k, avg sum / n.
int64_t k_of(size_t i) { return 1 + static_cast<int64_t>(i % 4); }

double expected(ncclDataType_t t, ncclRedOp_t op, int n, size_t i) {
  const int64_t k = k_of(i);
  int64_t sum = 0, prod = 1;
  for (int r = 0; r < n; ++r) {
    sum += (r + 1) * k;
    prod *= (r + 1) * k;
  }
  switch (op) {
    case ncclSum: return static_cast<double>(sum);
    case ncclProd: return static_cast<double>(prod);
    case ncclMax: return static_cast<double>(n * k);
    case ncclMin: return static_cast<double>(k);
    default: return is_float(t) ? static_cast<double>(sum) / n : static_cast<double>(sum / n);
  }
}

std::vector<uint8_t> fill(ncclDataType_t t, size_t count, const std::function<double(size_t)>& value) {
  std::vector<uint8_t> out;
  out.reserve(count * size_of(t));
  for (size_t i = 0; i < count; ++i) {
    const auto e = encode(t, value(i));
    out.insert(out.end(), e.begin(), e.end());
  }
  return out;
}

struct Bytes {
  explicit Bytes(size_t n) : size(n) { check_cuda(cudaMalloc(&ptr, n), "cudaMalloc"); }
  ~Bytes() { cudaFree(ptr); }
  void upload(const std::vector<uint8_t>& v) {
    check_cuda(cudaMemcpy(ptr, v.data(), v.size(), cudaMemcpyDefault), "up");
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> v(size);
    check_cuda(cudaMemcpy(v.data(), ptr, size, cudaMemcpyDefault), "down");
    return v;
  }
  void* ptr = nullptr;
  size_t size;
};

std::string name(const char* what, ncclDataType_t t, ncclRedOp_t op) {
  return std::string(what) + " type " + std::to_string(t) + " op " + std::to_string(op);
}

// Runs every collective x type x op on one rank; returns "" or what went wrong.
std::string matrix(int rank, int n, ncclComm_t comm, cudaStream_t s) {
  const auto mine = [&](ncclDataType_t t) { return fill(t, kCount, [&](size_t i) { return (rank + 1) * k_of(i); }); };
  for (const auto& [t, unused] : kTypeSizes) {
    (void)unused;
    const size_t bytes = kCount * size_of(t);
    for (ncclRedOp_t op : kOps) {
      const auto want = fill(t, kCount, [&](size_t i) { return expected(t, op, n, i); });
      // all_reduce, out of place and in place.
      Bytes in(bytes), out(bytes);
      in.upload(mine(t));
      check_nccl(ncclAllReduce(in.ptr, out.ptr, kCount, t, op, comm, s), "all_reduce");
      check_nccl(ncclAllReduce(in.ptr, in.ptr, kCount, t, op, comm, s), "all_reduce in place");
      cudaStreamSynchronize(s);
      if (out.download() != want || in.download() != want) return name("all_reduce", t, op);
      // reduce to the last rank; the others' receive buffers stay untouched.
      in.upload(mine(t));
      const std::vector<uint8_t> sentinel(bytes, 0x5a);
      out.upload(sentinel);
      check_nccl(ncclReduce(in.ptr, out.ptr, kCount, t, op, n - 1, comm, s), "reduce");
      cudaStreamSynchronize(s);
      if (out.download() != (rank == n - 1 ? want : sentinel)) return name("reduce", t, op);
      // reduce_scatter: segment p of rank r's input is (r + 1) * k(p * kCount + i).
      Bytes whole(bytes * n), part(bytes);
      whole.upload(fill(t, kCount * n, [&](size_t i) { return (rank + 1) * k_of(i); }));
      check_nccl(ncclReduceScatter(whole.ptr, part.ptr, kCount, t, op, comm, s), "reduce_scatter");
      cudaStreamSynchronize(s);
      const auto want_part = fill(t, kCount, [&](size_t i) { return expected(t, op, n, rank * kCount + i); });
      if (part.download() != want_part) return name("reduce_scatter", t, op);
      // reduce_scatter in place: the receive buffer is this rank's segment of the input.
      auto* own = static_cast<uint8_t*>(whole.ptr) + rank * bytes;
      check_nccl(ncclReduceScatter(whole.ptr, own, kCount, t, op, comm, s), "reduce_scatter in place");
      cudaStreamSynchronize(s);
      std::vector<uint8_t> got(bytes);
      check_cuda(cudaMemcpy(got.data(), own, bytes, cudaMemcpyDeviceToHost), "down");
      if (got != want_part) return name("reduce_scatter in place", t, op);
    }
    // broadcast from rank 1 (in place) and all_gather (out of place).
    Bytes b(bytes), gathered(bytes * n);
    b.upload(rank == 1 ? mine(t) : std::vector<uint8_t>(bytes, 0));
    check_nccl(ncclBroadcast(b.ptr, b.ptr, kCount, t, 1, comm, s), "broadcast");
    check_nccl(ncclAllGather(b.ptr, gathered.ptr, kCount, t, comm, s), "all_gather");
    cudaStreamSynchronize(s);
    const auto from_1 = fill(t, kCount, [&](size_t i) { return 2 * k_of(i); });
    if (b.download() != from_1) return name("broadcast", t, ncclSum);
    std::vector<uint8_t> all;
    for (int r = 0; r < n; ++r) all.insert(all.end(), from_1.begin(), from_1.end());
    if (gathered.download() != all) return name("all_gather", t, ncclSum);
    // broadcast out of place (the root's send buffer stays), all_gather in place
    // (the send buffer is this rank's segment of the receive buffer).
    Bytes root_in(bytes), copy(bytes), inplace(bytes * n);
    root_in.upload(rank == 1 ? mine(t) : std::vector<uint8_t>(bytes, 0));
    check_nccl(ncclBroadcast(root_in.ptr, copy.ptr, kCount, t, 1, comm, s), "broadcast out of place");
    auto* own = static_cast<uint8_t*>(inplace.ptr) + rank * bytes;
    check_cuda(cudaMemcpyAsync(own, copy.ptr, bytes, cudaMemcpyDeviceToDevice, s), "d2d");
    check_nccl(ncclAllGather(own, inplace.ptr, kCount, t, comm, s), "all_gather in place");
    cudaStreamSynchronize(s);
    if (copy.download() != from_1 || (rank == 1 && root_in.download() != mine(t)))
      return name("broadcast out of place", t, ncclSum);
    if (inplace.download() != all) return name("all_gather in place", t, ncclSum);
  }
  return "";
}

}  // namespace

TEST_CASE("collectives: every collective x type x op gives exact values over 2, 3 and 4 processes",
          "[double][nccl]") {
  require_double();
  const auto before = segments();
  for (int n : {2, 3, 4}) {
    INFO(n << " ranks");
    const auto out = forked_ranks(n, [n](int rank, ncclUniqueId id) {
      check_cuda(cudaSetDevice(rank), "cudaSetDevice");
      ncclComm_t comm = nullptr;
      check_nccl(ncclCommInitRank(&comm, n, id, rank), "init");
      cudaStream_t s = nullptr;
      check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
      std::string wrong = matrix(rank, n, comm, s);
      ncclCommDestroy(comm);
      cudaStreamDestroy(s);
      return wrong.empty() ? std::string("ok") : wrong;
    });
    CHECK(out == std::vector<std::string>(n, "ok"));
  }
  CHECK(leftovers(before).empty());
}

TEST_CASE("collectives: f16 and bf16 round to nearest even", "[double][nccl]") {
  require_double();
  // Each pair sums to a tie: f16 1 + 2^-11 -> 1 (even), 1 + 2^-10 + 2^-11 -> 1 + 2^-9
  // (even); bf16 2048 + 8 -> 2048, 2064 + 8 -> 2080.
  const auto out = forked_ranks(2, [](int rank, ncclUniqueId id) {
    check_cuda(cudaSetDevice(rank), "cudaSetDevice");
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommInitRank(&comm, 2, id, rank), "init");
    const double f16_in[2][2] = {{1.0, 1.0 + std::ldexp(1.0, -10)}, {std::ldexp(1.0, -11), std::ldexp(1.0, -11)}};
    const double bf16_in[2][2] = {{2048.0, 2064.0}, {8.0, 8.0}};
    Bytes h(4), b(4);
    h.upload(fill(ncclFloat16, 2, [&](size_t i) { return f16_in[rank][i]; }));
    b.upload(fill(ncclBfloat16, 2, [&](size_t i) { return bf16_in[rank][i]; }));
    check_nccl(ncclAllReduce(h.ptr, h.ptr, 2, ncclFloat16, ncclSum, comm, nullptr), "f16");
    check_nccl(ncclAllReduce(b.ptr, b.ptr, 2, ncclBfloat16, ncclSum, comm, nullptr), "bf16");
    const double f16_want[2] = {1.0, 1.0 + std::ldexp(1.0, -9)};
    const double bf16_want[2] = {2048.0, 2080.0};
    const bool ok = h.download() == fill(ncclFloat16, 2, [&](size_t i) { return f16_want[i]; }) &&
                    b.download() == fill(ncclBfloat16, 2, [&](size_t i) { return bf16_want[i]; });
    ncclCommDestroy(comm);
    return std::string(ok ? "ok" : "not rounded to nearest even");
  });
  CHECK(out == std::vector<std::string>(2, "ok"));
}

TEST_CASE("collectives: a 256 MiB all_reduce passes through the bounded segment", "[double][nccl]") {
  require_double();
  const auto before = segments();
  constexpr size_t kFloats = (256u << 20) / sizeof(float);
  const auto out = forked_ranks(2, [](int rank, ncclUniqueId id) {
    check_cuda(cudaSetDevice(rank), "cudaSetDevice");
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommInitRank(&comm, 2, id, rank), "init");
    DeviceBuffer<float> buf(kFloats);
    std::vector<float> v(kFloats);
    for (size_t i = 0; i < kFloats; ++i) v[i] = static_cast<float>((i % 1000) * (rank + 1));
    buf.upload(v);
    check_nccl(ncclAllReduce(buf.ptr, buf.ptr, kFloats, ncclFloat32, ncclSum, comm, nullptr), "all_reduce");
    const auto got = buf.download();
    for (size_t i = 0; i < kFloats; ++i)
      if (got[i] != static_cast<float>((i % 1000) * 3)) return "wrong at " + std::to_string(i);
    ncclCommDestroy(comm);
    return std::string("ok");
  }, 300s);
  CHECK(out == std::vector<std::string>(2, "ok"));
  CHECK(leftovers(before).empty());
}
