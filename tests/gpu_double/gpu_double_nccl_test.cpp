// The NCCL double: forming communicators, refusals, point-to-point and grouped
// calls, split, abort, a peer that never comes or dies, and no /dev/shm leftovers.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include <memory>
#include <unistd.h>

#include "double_test_support.hpp"

using namespace gpu_double_test;

namespace {

// CPU time of this process so far (every thread).
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace

TEST_CASE("nccl: ranks of one host on one device are refused with ncclInvalidUsage", "[double][nccl]") {
  require_double();
  const auto before = segments();
  const ncclUniqueId id = new_id();
  ncclComm_t a = start_init(id, 2, 0, 1);
  ncclComm_t b = start_init(id, 2, 1, 1);
  CHECK(settle(a) == ncclInvalidUsage);
  CHECK(settle(b) == ncclInvalidUsage);
  CHECK(std::string(ncclGetLastError(nullptr)).find("Duplicate GPU") != std::string::npos);
  ncclCommAbort(a);
  ncclCommAbort(b);
  CHECK(leftovers(before).empty());
}

TEST_CASE("nccl: a segment left by a rank that died before its peers came goes at the next init",
          "[double][nccl]") {
  require_double();
  const auto before = segments();
  const auto names = forked_ranks(1, [&](int, ncclUniqueId id) {
    start_init(id, 2, 0, 0);  // rank 1 never comes
    std::set<std::string> mine;
    if (!eventually([&] { return !(mine = leftovers(before)).empty(); }, 5s)) return std::string("no segment");
    std::this_thread::sleep_for(50ms);  // its slot is written right after the mapping
    return *mine.begin();               // and the process ends without aborting
  });
  REQUIRE(names[0].rfind("gpu_double_", 0) == 0);
  // The next init on the machine collects it (this one, or one of a test running beside).
  forked_ranks(1, [](int, ncclUniqueId) {
    for (auto* c : local_comms(2)) ncclCommAbort(c);
    return std::string("ok");
  });
  CHECK(segments().count(names[0]) == 0);
  CHECK(leftovers(before).empty());
}

TEST_CASE("nccl: finalize flushes and a non-blocking one answers ncclInProgress and twice is refused",
          "[double][nccl]") {
  require_double();
  const auto before = segments();
  auto comms = local_comms(2);
  std::vector<std::unique_ptr<DeviceBuffer<double>>> bufs;
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    bufs.push_back(std::make_unique<DeviceBuffer<double>>(100000));
    bufs.back()->upload(std::vector<double>(100000, r + 1.0));
    const ncclResult_t launched =
        ncclAllReduce(bufs[r]->ptr, bufs[r]->ptr, 100000, ncclFloat64, ncclSum, comms[r], nullptr);
    CHECK((launched == ncclSuccess || launched == ncclInProgress));
  }
  for (auto* c : comms) CHECK(ncclCommFinalize(c) == ncclInProgress);
  for (auto* c : comms) CHECK(settle(c) == ncclSuccess);
  CHECK(ncclCommFinalize(comms[0]) == ncclInvalidArgument);
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    CHECK(bufs[r]->download() == std::vector<double>(100000, 3.0));
  }
  for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
  CHECK(leftovers(before).empty());
}

TEST_CASE("nccl: send/recv and a grouped all_to_all (with a send to oneself) over 4 processes", "[double][nccl]") {
  require_double();
  const auto before = segments();
  constexpr int kRanks = 4;
  constexpr size_t kChunk = 100003;  // odd, and over the channel size in bytes
  const auto out = forked_ranks(kRanks, [](int rank, ncclUniqueId id) {
    check_cuda(cudaSetDevice(rank), "cudaSetDevice");
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommInitRank(&comm, kRanks, id, rank), "ncclCommInitRank");
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    // all_to_all: chunk p of rank r's input holds r * 1000 + p.
    DeviceBuffer<int32_t> in(kChunk * kRanks), got(kChunk * kRanks);
    std::vector<int32_t> mine(kChunk * kRanks);
    for (int p = 0; p < kRanks; ++p)
      std::fill(mine.begin() + p * kChunk, mine.begin() + (p + 1) * kChunk, rank * 1000 + p);
    in.upload(mine);
    check_nccl(ncclGroupStart(), "group");
    for (int p = 0; p < kRanks; ++p) {
      check_nccl(ncclSend(in.ptr + p * kChunk, kChunk, ncclInt32, p, comm, s), "send");
      check_nccl(ncclRecv(got.ptr + p * kChunk, kChunk, ncclInt32, p, comm, s), "recv");
    }
    check_nccl(ncclGroupEnd(), "group end");
    // A ring of plain send/recv in one group: to the right, from the left.
    DeviceBuffer<int64_t> token(3), from_left(3);
    token.upload({rank, rank * 2, rank * 3});
    check_nccl(ncclGroupStart(), "group");
    check_nccl(ncclSend(token.ptr, 3, ncclInt64, (rank + 1) % kRanks, comm, s), "send");
    check_nccl(ncclRecv(from_left.ptr, 3, ncclInt64, (rank + kRanks - 1) % kRanks, comm, s), "recv");
    check_nccl(ncclGroupEnd(), "group end");
    check_cuda(cudaStreamSynchronize(s), "sync");
    const auto all = got.download();
    for (int p = 0; p < kRanks; ++p)
      for (size_t i = 0; i < kChunk; ++i)
        if (all[p * kChunk + i] != p * 1000 + rank) return std::string("bad all_to_all element");
    const int left = (rank + kRanks - 1) % kRanks;
    if (from_left.download() != std::vector<int64_t>{left, left * 2, left * 3}) return std::string("bad ring");
    check_nccl(ncclCommDestroy(comm), "destroy");
    cudaStreamDestroy(s);
    return std::string("ok");
  });
  CHECK(out == std::vector<std::string>(kRanks, "ok"));
  CHECK(leftovers(before).empty());
}

TEST_CASE("nccl: split by color and key, NCCL_SPLIT_NOCOLOR gets nullptr, blocking and not", "[double][nccl]") {
  require_double();
  const auto before = segments();
  constexpr int kRanks = 4;
  const auto out = forked_ranks(kRanks, [](int rank, ncclUniqueId id) {
    ncclComm_t parent = start_init(id, kRanks, rank, rank);
    if (settle(parent) != ncclSuccess) return std::string("init failed");
    // Colors: ranks 0, 2 -> 0; rank 1 -> 1 (alone); rank 3 -> none. Key reverses order.
    const int color = rank == 3 ? NCCL_SPLIT_NOCOLOR : rank % 2;
    std::string report;
    for (int blocking : {0, 1}) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = blocking;
      ncclComm_t child = nullptr;
      // Even a non-blocking parent answers ncclSuccess; the parent reports the progress.
      if (ncclCommSplit(parent, color, -rank, &child, &config) != ncclSuccess) return std::string("split refused");
      if (settle(parent) != ncclSuccess) return std::string("split did not settle");
      if (color == NCCL_SPLIT_NOCOLOR) {
        report += child == nullptr ? "none " : "child? ";
        continue;
      }
      if (child == nullptr) return std::string("no child");
      int n = 0, r = -1;
      ncclCommCount(child, &n);
      ncclCommUserRank(child, &r);
      DeviceBuffer<int32_t> v(5);
      v.upload(std::vector<int32_t>(5, rank + 1));
      const ncclResult_t launched = ncclAllReduce(v.ptr, v.ptr, 5, ncclInt32, ncclSum, child, nullptr);
      if (launched != ncclSuccess && launched != ncclInProgress) return std::string("all_reduce refused");
      if (settle(child) != ncclSuccess) return std::string("child failed");
      report += std::to_string(n) + ":" + std::to_string(r) + ":" + std::to_string(v.download()[0]) + " ";
      ncclCommDestroy(child);
    }
    ncclCommDestroy(parent);
    return report;
  });
  CHECK(out[0] == "2:1:4 2:1:4 ");  // with rank 2 (sum 1 + 3), second by key
  CHECK(out[1] == "1:0:2 1:0:2 ");
  CHECK(out[2] == "2:0:4 2:0:4 ");
  CHECK(out[3] == "none none ");
  CHECK(leftovers(before).empty());
}

TEST_CASE("nccl: abort ends an operation whose peer never came and its event fires", "[double][nccl]") {
  require_double();
  const auto before = segments();
  const auto out = forked_ranks(1, [](int, ncclUniqueId) {
    // Rank 1 joins and then never calls.
    auto comms = local_comms(2);
    cudaSetDevice(0);
    DeviceBuffer<float> buf(1 << 20);
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    cudaEvent_t done = nullptr;
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    const ncclResult_t r = ncclAllReduce(buf.ptr, buf.ptr, buf.n, ncclFloat32, ncclSum, comms[0], s);
    if (r != ncclSuccess && r != ncclInProgress) return std::string("refused");
    cudaEventRecord(done, s);
    if (!stays_pending([&] { return cudaEventQuery(done); }, 300ms)) return std::string("finished without its peer");
    ncclResult_t state = ncclInternalError;
    ncclCommGetAsyncError(comms[0], &state);
    if (state != ncclSuccess) return std::string("not healthy while pending");
    // A pending operation sleeps: half a second of it costs well under a tenth of a core.
    const double cpu_before = cpu_seconds();
    stays_pending([&] { return cudaEventQuery(done); }, 500ms);
    const double cpu = cpu_seconds() - cpu_before;
    if (cpu > 0.05) return "a pending operation used " + std::to_string(cpu) + " s of CPU in 0.5 s";
    check_nccl(ncclCommAbort(comms[0]), "abort");
    if (!eventually([&] { return cudaEventQuery(done) == cudaSuccess; }, 5s)) return std::string("event never fired");
    check_nccl(ncclCommAbort(comms[1]), "abort");
    cudaStreamDestroy(s);
    return std::string("ok");
  });
  CHECK(out[0] == "ok");
  CHECK(leftovers(before).empty());
}

TEST_CASE("nccl: a peer killed mid-operation leaves the survivor pending until abort", "[double][nccl]") {
  require_double();
  const auto before = segments();
  constexpr size_t kHalf = 1u << 20;
  const auto out = forked_ranks(1, [](int, ncclUniqueId id) {
    // The peer is this process's child, so that it can be killed and reaped here. It
    // sends the first half, then its stream stalls before the second.
    const pid_t peer = fork();
    if (peer == 0) {
      cudaSetDevice(1);
      ncclComm_t comm = nullptr;
      if (ncclCommInitRank(&comm, 2, id, 1) != ncclSuccess) _exit(3);
      DeviceBuffer<uint8_t> data(2 * kHalf);
      cudaMemset(data.ptr, 0xab, data.n);
      ncclSend(data.ptr, kHalf, ncclUint8, 0, comm, nullptr);
      cudaLaunchHostFunc(nullptr, [](void*) { pause(); }, nullptr);
      ncclSend(data.ptr + kHalf, kHalf, ncclUint8, 0, comm, nullptr);
      cudaStreamSynchronize(nullptr);  // killed while this waits
      _exit(4);
    }
    cudaSetDevice(0);
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommInitRank(&comm, 2, id, 0), "init");
    DeviceBuffer<uint8_t> got(2 * kHalf);
    cudaMemset(got.ptr, 0, got.n);
    cudaEvent_t done = nullptr;
    cudaEventCreate(&done);
    // One operation: both halves in one group.
    check_nccl(ncclGroupStart(), "group");
    check_nccl(ncclRecv(got.ptr, kHalf, ncclUint8, 1, comm, nullptr), "recv");
    check_nccl(ncclRecv(got.ptr + kHalf, kHalf, ncclUint8, 1, comm, nullptr), "recv");
    check_nccl(ncclGroupEnd(), "group end");
    cudaEventRecord(done, nullptr);
    // Watch the first half arrive (peeking past the streams), then kill the sender.
    auto peek = reinterpret_cast<int (*)(void*, const void*, size_t)>(dlsym(RTLD_DEFAULT, "gpu_double_peek"));
    if (peek == nullptr) return std::string("gpu_double_peek not exported");
    uint8_t last_of_first = 0;
    const auto arrived = [&] { return peek(&last_of_first, got.ptr + kHalf - 1, 1) == 0 && last_of_first == 0xab; };
    if (!eventually(arrived, 10s)) {
      kill(peer, SIGKILL);
      waitpid(peer, nullptr, 0);
      return std::string("first half never came");
    }
    kill(peer, SIGKILL);
    waitpid(peer, nullptr, 0);
    if (!stays_pending([&] { return cudaEventQuery(done); }, 500ms)) return std::string("finished without its peer");
    ncclResult_t state = ncclInternalError;
    ncclCommGetAsyncError(comm, &state);
    if (state != ncclSuccess) return std::string("the double reported the death itself");
    check_nccl(ncclCommAbort(comm), "abort");
    if (!eventually([&] { return cudaEventQuery(done) == cudaSuccess; }, 5s)) return std::string("event never fired");
    return std::string("ok");
  });
  CHECK(out[0] == "ok");
  CHECK(leftovers(before).empty());
}
