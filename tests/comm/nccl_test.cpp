// The NCCL backend. The unique-id exchange runs for real on any machine (4 forked
// processes, a real store server; ncclGetUniqueId needs no GPU). Collectives need a
// GPU: those tests carry [gpu] and say why they skip when there is none.
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // TestEventListenerBase, for ExpectDouble
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "group_setup.hpp"
#include "forked.hpp"
#include "gpu_double_check.hpp"
#include "rdzv/memory_store.hpp"
#include "server_fixture.hpp"

using namespace std::chrono_literals;
using ddp::detail::exchange_nccl_unique_id;

namespace {

// Bytes as hex, so that a failed comparison prints something readable.
std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// ---------------------------------------------------------------------------------
// GPU helpers
// ---------------------------------------------------------------------------------

// Number of visible CUDA devices, or 0 with the reason in `why`.
int cuda_devices(std::string& why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0) why = "cudaGetDeviceCount returned 0";
  return n;
}

// Where a device is expected (DDP_EXPECT_GPU=1: the GPU test double), no device
// fails the test instead of skipping it.
bool gpu_expected() {
  const char* e = std::getenv("DDP_EXPECT_GPU");
  return e != nullptr && std::string(e) == "1";
}

// Under the double (DDP_EXPECT_GPU_DOUBLE=1) the CUDA runtime and NCCL in this process
// must be the double's: a binary whose RPATH named the real libraries would run on them.
// Checked when the test run starts, before any test case, so none can miss it: the run
// then stops with exit status 2 and the reason.
struct ExpectDouble : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(const Catch::TestRunInfo& info) override {
    TestEventListenerBase::testRunStarting(info);
    if (const std::string problem = gpu_double_check::expected_problem(); !problem.empty()) {
      std::fprintf(stderr, "nccl_tests: %s\n", problem.c_str());
      std::exit(2);
    }
  }
};
CATCH_REGISTER_LISTENER(ExpectDouble)

#define SKIP_WITHOUT_GPU(devices)                                    \
  std::string why_;                                                  \
  const int devices = cuda_devices(why_);                            \
  if (devices == 0) {                                                \
    if (gpu_expected()) FAIL("no CUDA device (DDP_EXPECT_GPU=1): " << why_); \
    WARN("SKIPPED: no CUDA device: " << why_);                       \
    return;                                                          \
  }

// Runs `body(rank)` for `n` ranks on threads (one GPU per rank: NCCL refuses two
// ranks of one communicator on the same GPU, so threads over distinct devices are
// how a single machine tests more than one rank). Returns each rank's error text.
std::vector<std::string> run_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

ddp::detail::GroupSetup setup_for(std::shared_ptr<rdzv::Store> store, int rank, int size) {
  ddp::detail::GroupSetup s;
  s.store = std::move(store);
  s.rank = rank;
  s.size = size;
  s.local_rank = rank;
  s.timeout = 60s;
  s.connect_timeout = 60s;
  return s;
}

// A device buffer that frees itself.
template <typename T>
struct DeviceArray {
  explicit DeviceArray(size_t n) : count(n) {
    if (cudaMalloc(&ptr, n * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  ~DeviceArray() { cudaFree(ptr); }
  void upload(const std::vector<T>& v) { cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> v(count);
    cudaMemcpy(v.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  ddp::Buffer buffer() const { return ddp::Buffer{ptr, count, ddp::dtype_of<T>::value, ddp::Device::Cuda}; }
  T* ptr = nullptr;
  size_t count;
};

}  // namespace

// Processes, not threads: each rank is its own process with its own TcpStore
// connection, as under ddprun. No CUDA is touched before fork().
TEST_CASE("every rank of 4 processes gets rank 0s real ncclUniqueId through the store", "[nccl]") {
  constexpr int kRanks = 4;
  testing::ServerThread server;
  // Keeps the namespace alive: the server drops a namespace's keys when its last
  // connection closes, and rank 0 may finish before the others have read the key.
  auto keeper = server.client();
  const auto options = server.client_options();

  std::vector<testing::ForkedChild> children;
  for (int rank = 0; rank < kRanks; ++rank) {
    children.emplace_back([rank, options] {
      rdzv::TcpStore store(options);
      return exchange_nccl_unique_id(store, "job/nccl_unique_id", rank, 30s);
    });
  }

  std::vector<std::string> ids;
  for (auto& child : children) {
    const auto r = child.wait(60s);  // the others are killed and reaped if this throws
    INFO("child " << child.pid() << " exited with " << r.status << ": " << r.payload);
    REQUIRE(r.ok);
    ids.push_back(r.payload);
  }

  REQUIRE(ids[0].size() == sizeof(ncclUniqueId));
  REQUIRE(ids[0].size() == 128);
  for (int r = 1; r < kRanks; ++r) CHECK(hex(ids[r]) == hex(ids[0]));
  CHECK(std::any_of(ids[0].begin(), ids[0].end(), [](char c) { return c != 0; }));
  // And it is exactly what rank 0 published.
  CHECK(hex(keeper->get("job/nccl_unique_id", 1s)) == hex(ids[0]));
}

TEST_CASE("a rank waiting for a unique id nobody publishes gets Timeout", "[nccl]") {
  rdzv::MemoryStore store;
  CHECK_THROWS_AS(exchange_nccl_unique_id(store, "never", 1, 100ms), ddp::Timeout);
}

TEST_CASE("a unique id of the wrong size is an Error", "[nccl]") {
  rdzv::MemoryStore store;
  store.set("short", "abc");
  CHECK_THROWS_AS(exchange_nccl_unique_id(store, "short", 2, 1s), ddp::Error);
}

TEST_CASE("nccl_usable(): only when every local rank can have a GPU of its own", "[nccl]") {
  std::string why;
  const int devices = cuda_devices(why);
  CHECK(ddp::detail::nccl_usable(1) == (devices > 0));
  CHECK(ddp::detail::nccl_usable(devices) == (devices > 0));
  CHECK_FALSE(ddp::detail::nccl_usable(devices + 1));  // more ranks than GPUs: cpu only
}

TEST_CASE("nccl all_reduce sums over every GPU of this machine", "[nccl][gpu]") {
  SKIP_WITHOUT_GPU(devices);
  const int n = std::min(devices, 4);
  auto store = std::make_shared<rdzv::MemoryStore>();
  std::vector<std::vector<float>> results(n);
  std::vector<std::vector<int32_t>> gathered(n);
  auto errors = run_ranks(n, [&](int rank) {
    auto pg = std::make_shared<ddp::ProcessGroup>(ddp::detail::make_nccl_backend(setup_for(store, rank, n)));
    if (pg->backend() != "nccl" || pg->rank() != rank || pg->size() != n) throw std::runtime_error("bad group");

    DeviceArray<float> buf(1000);
    buf.upload(std::vector<float>(1000, static_cast<float>(rank + 1)));
    pg->all_reduce(buf.buffer());
    results[rank] = buf.download();

    // Asynchronous: the Work completes later; wait() makes the result visible.
    DeviceArray<int32_t> in(1), out(n);
    in.upload({rank * 10});
    auto work = pg->all_gather(in.buffer(), out.buffer(), {.async_op = true});
    work.wait(30s);
    if (!work.is_completed()) throw std::runtime_error("work not completed after wait()");
    gathered[rank] = out.download();

    pg->barrier();
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
    const float want = static_cast<float>(n * (n + 1) / 2);
    CHECK(std::all_of(results[r].begin(), results[r].end(), [&](float v) { return v == want; }));
    for (int i = 0; i < n; ++i) CHECK(gathered[r][i] == i * 10);
  }
}

TEST_CASE("nccl: the group's own checks refuse host buffers and bad roots and keep it but abort() breaks it",
          "[nccl][gpu]") {
  SKIP_WITHOUT_GPU(devices);
  (void)devices;
  auto store = std::make_shared<rdzv::MemoryStore>();
  auto pg = std::make_shared<ddp::ProcessGroup>(ddp::detail::make_nccl_backend(setup_for(store, 0, 1)));

  // ProcessGroup refuses these before NCCL sees them: the group stays usable.
  std::vector<float> host(4, 1.0f);
  CHECK_THROWS_AS(pg->all_reduce(ddp::view(host)), ddp::InvalidArgument);
  DeviceArray<float> buf(4);
  CHECK_THROWS_AS(pg->broadcast(buf.buffer(), 1), ddp::InvalidArgument);
  // A group of one: all_reduce leaves the values as they are.
  buf.upload({1, 2, 3, 4});
  pg->all_reduce(buf.buffer(), ddp::ReduceOp::Max);
  CHECK(buf.download() == std::vector<float>{1, 2, 3, 4});

  pg->abort("test");
  CHECK_THROWS_AS(pg->all_reduce(buf.buffer()), ddp::Error);
  CHECK_THROWS_WITH(pg->barrier(), Catch::Contains("test"));
}

// NCCL records a refused call on a non-blocking communicator and refuses every later
// one (NCCL 2.28 on an H200): the backend breaks the group with InvalidArgument naming
// the call. The backend is driven directly, so NCCL (not ProcessGroup) sees root 5 of 1.
TEST_CASE("nccl: a call NCCL refuses breaks the group with InvalidArgument and later calls rethrow it",
          "[nccl][gpu]") {
  SKIP_WITHOUT_GPU(devices);
  (void)devices;
  auto store = std::make_shared<rdzv::MemoryStore>();
  auto backend = ddp::detail::make_nccl_backend(setup_for(store, 0, 1));
  DeviceArray<float> buf(4);
  ddp::detail::Op bad;
  bad.kind = ddp::detail::OpKind::Broadcast;
  bad.input = bad.output = buf.buffer();
  bad.peer = 5;
  bad.seq = 1;
  std::string first;
  try {
    backend->run(bad);
    FAIL("NCCL accepted broadcast root 5 of a group of 1");
  } catch (const ddp::InvalidArgument& e) {
    first = e.what();
  }
  INFO(first);
  CHECK_THAT(first, Catch::StartsWith("NCCL broadcast #1 of group 0 was refused: invalid argument"));
  CHECK_THAT(first, Catch::EndsWith("so the group can no longer be used"));
  ddp::detail::Op good;
  good.kind = ddp::detail::OpKind::AllReduce;
  good.input = good.output = buf.buffer();
  good.seq = 2;
  for (int i = 0; i < 2; ++i) {
    try {
      backend->run(good);
      FAIL("a call after NCCL's refusal was accepted");
    } catch (const ddp::InvalidArgument& e) {
      CHECK(std::string(e.what()) == first);
    }
  }
}

TEST_CASE("nccl new_group splits off a subgroup and the other ranks get nullptr", "[nccl][gpu]") {
  SKIP_WITHOUT_GPU(devices);
  if (devices < 2) {
    WARN("SKIPPED: needs 2 CUDA devices, found " << devices);
    return;
  }
  const int n = std::min(devices, 4);
  auto store = std::make_shared<rdzv::MemoryStore>();
  std::vector<int> sub_rank(n, -2);
  std::vector<float> sums(n, 0);
  auto errors = run_ranks(n, [&](int rank) {
    auto pg = std::make_shared<ddp::ProcessGroup>(ddp::detail::make_nccl_backend(setup_for(store, rank, n)));
    // Ranks {1, 0}: the subgroup's rank 0 is the parent's rank 1.
    auto sub = pg->new_group({1, 0});
    if (!sub) {
      sub_rank[rank] = -1;
      return;
    }
    sub_rank[rank] = sub->rank();
    DeviceArray<float> buf(1);
    buf.upload({static_cast<float>(rank + 1)});
    sub->all_reduce(buf.buffer());
    sums[rank] = buf.download()[0];
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
  }
  CHECK(sub_rank[0] == 1);
  CHECK(sub_rank[1] == 0);
  for (int r = 2; r < n; ++r) CHECK(sub_rank[r] == -1);
  CHECK(sums[0] == 3.0f);
  CHECK(sums[1] == 3.0f);
}
