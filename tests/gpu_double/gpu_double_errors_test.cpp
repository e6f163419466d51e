// The NCCL double's refusals, as NCCL 2.28.9 answered them on an H200: a bad
// argument poisons a non-blocking communicator but not a blocking one, a group with
// a refused call launches nothing and ncclGroupEnd returns the error, and a call
// before the communicator is ready is ncclInvalidArgument.
#include <functional>
#include <memory>

#include "double_test_support.hpp"

using namespace gpu_double_test;

namespace {

ncclResult_t state_of(ncclComm_t comm) {
  ncclResult_t s = ncclInternalError;
  ncclCommGetAsyncError(comm, &s);
  return s;
}

// Blocking communicators of ranks 0..n-1 on devices 0..n-1, formed by one thread each.
std::vector<ncclComm_t> blocking_comms(int n) {
  const ncclUniqueId id = new_id();
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<ncclResult_t> results(n, ncclInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      results[r] = ncclCommInitRank(&comms[r], n, id, r);
    });
  for (auto& t : threads) t.join();
  for (auto r : results)
    if (r != ncclSuccess) throw std::runtime_error("blocking init answered " + std::to_string(r));
  return comms;
}

// A float buffer of `n` values on each of two ranks (device = rank), filled with rank + 1.
struct TwoBuffers {
  explicit TwoBuffers(size_t n) {
    for (int r = 0; r < 2; ++r) {
      cudaSetDevice(r);
      at.push_back(std::make_unique<DeviceBuffer<float>>(n));
      at.back()->upload(std::vector<float>(n, r + 1.0f));
    }
    cudaSetDevice(0);
  }
  std::vector<float> read(int r) {
    cudaSetDevice(r);
    return at[r]->download();
  }
  std::vector<std::unique_ptr<DeviceBuffer<float>>> at;
};

// A summing all_reduce of both ranks' buffers, grouped from this thread.
ncclResult_t sum_both(const std::vector<ncclComm_t>& comms, TwoBuffers& b) {
  ncclGroupStart();
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    ncclAllReduce(b.at[r]->ptr, b.at[r]->ptr, b.at[r]->n, ncclFloat32, ncclSum, comms[r], nullptr);
  }
  const ncclResult_t end = ncclGroupEnd();
  cudaSetDevice(0);
  return end;
}

using BadCall = std::function<ncclResult_t(ncclComm_t, float*)>;

std::vector<std::pair<const char*, BadCall>> bad_calls() {
  static std::vector<float> host(8, 1.0f);
  return {
      {"host pointer", [](ncclComm_t c, float*) {
         return ncclAllReduce(host.data(), host.data(), 8, ncclFloat32, ncclSum, c, nullptr);
       }},
      {"beyond the allocation", [](ncclComm_t c, float* p) {
         return ncclAllReduce(p, p, 9, ncclFloat32, ncclSum, c, nullptr);
       }},
      {"fp8", [](ncclComm_t c, float* p) { return ncclAllReduce(p, p, 8, ncclFloat8e4m3, ncclSum, c, nullptr); }},
      {"dtype 99", [](ncclComm_t c, float* p) {
         return ncclAllReduce(p, p, 8, static_cast<ncclDataType_t>(99), ncclSum, c, nullptr);
       }},
      {"bad op", [](ncclComm_t c, float* p) { return ncclAllReduce(p, p, 8, ncclFloat32, ncclNumOps, c, nullptr); }},
      {"root 5 of 2", [](ncclComm_t c, float* p) { return ncclBroadcast(p, p, 8, ncclFloat32, 5, c, nullptr); }},
      {"peer -1", [](ncclComm_t c, float* p) { return ncclSend(p, 8, ncclFloat32, -1, c, nullptr); }},
  };
}

}  // namespace

TEST_CASE("errors: a bad argument poisons a non-blocking communicator for good", "[double][nccl]") {
  require_double();
  const auto before = segments();
  for (const auto& [what, call] : bad_calls()) {
    INFO(what);
    auto comms = local_comms(2);
    TwoBuffers b(8);
    cudaSetDevice(0);
    CHECK(call(comms[0], b.at[0]->ptr) == ncclInvalidArgument);
    CHECK(std::string(ncclGetLastError(comms[0])).find("failed earlier") == std::string::npos);
    CHECK(state_of(comms[0]) == ncclInvalidArgument);
    // Every later call, even a valid one, answers the error; the peer is not affected.
    CHECK(ncclAllReduce(b.at[0]->ptr, b.at[0]->ptr, 8, ncclFloat32, ncclSum, comms[0], nullptr) ==
          ncclInvalidArgument);
    ncclComm_t child = nullptr;
    CHECK(ncclCommSplit(comms[0], 0, 0, &child, nullptr) == ncclInvalidArgument);
    CHECK(child == nullptr);
    CHECK(std::string(ncclGetLastError(comms[0])).find("not ready") != std::string::npos);
    CHECK(state_of(comms[0]) == ncclInvalidArgument);
    CHECK(state_of(comms[1]) == ncclSuccess);
    for (auto* c : comms) CHECK(ncclCommAbort(c) == ncclSuccess);
  }
  CHECK(leftovers(before).empty());
}

TEST_CASE("errors: a bad argument leaves a blocking communicator usable", "[double][nccl]") {
  require_double();
  const auto before = segments();
  auto comms = blocking_comms(2);
  TwoBuffers b(8);
  for (const auto& [what, call] : bad_calls()) {
    INFO(what);
    CHECK(call(comms[0], b.at[0]->ptr) == ncclInvalidArgument);
    CHECK(state_of(comms[0]) == ncclSuccess);
  }
  CHECK(sum_both(comms, b) == ncclSuccess);
  CHECK(b.read(0) == std::vector<float>(8, 3.0f));
  CHECK(b.read(1) == std::vector<float>(8, 3.0f));
  for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
  CHECK(leftovers(before).empty());
}

TEST_CASE("errors: a group with a refused call launches none of its calls and ncclGroupEnd returns the error",
          "[double][nccl]") {
  require_double();
  const auto before = segments();
  const auto dtype99 = static_cast<ncclDataType_t>(99);
  SECTION("non-blocking: the group's communicators keep the error") {
    auto comms = local_comms(2);
    TwoBuffers b(8);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    cudaSetDevice(1);
    CHECK(ncclAllReduce(b.at[1]->ptr, b.at[1]->ptr, 8, ncclFloat32, ncclSum, comms[1], nullptr) == ncclSuccess);
    cudaSetDevice(0);
    CHECK(ncclAllReduce(b.at[0]->ptr, b.at[0]->ptr, 8, ncclFloat32, ncclSum, comms[0], nullptr) == ncclSuccess);
    CHECK(ncclAllReduce(b.at[0]->ptr, b.at[0]->ptr, 8, dtype99, ncclSum, comms[0], nullptr) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidArgument);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(b.read(0) == std::vector<float>(8, 1.0f));  // nothing ran
    CHECK(b.read(1) == std::vector<float>(8, 2.0f));
    CHECK(state_of(comms[0]) == ncclInvalidArgument);
    // The double's choice (NCCL's group cleanup marks each non-blocking communicator
    // of the group): the other communicator of the group keeps the error too.
    CHECK(state_of(comms[1]) == ncclInvalidArgument);
    for (auto* c : comms) CHECK(ncclCommAbort(c) == ncclSuccess);
  }
  SECTION("blocking: the group is dropped and the communicators stay usable") {
    auto comms = blocking_comms(2);
    TwoBuffers b(8);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    CHECK(ncclAllReduce(b.at[0]->ptr, b.at[0]->ptr, 8, ncclFloat32, ncclSum, comms[0], nullptr) == ncclSuccess);
    CHECK(ncclAllReduce(b.at[0]->ptr, b.at[0]->ptr, 8, dtype99, ncclSum, comms[0], nullptr) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidArgument);
    CHECK(state_of(comms[0]) == ncclSuccess);
    // Had the valid call been launched, rank 1's next all_reduce would match it.
    CHECK(sum_both(comms, b) == ncclSuccess);
    CHECK(b.read(0) == std::vector<float>(8, 3.0f));
    CHECK(b.read(1) == std::vector<float>(8, 3.0f));
    for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
  }
  CHECK(ncclGroupEnd() == ncclInvalidUsage);  // no group open: the failed one was closed
  CHECK(leftovers(before).empty());
}

TEST_CASE("errors: a call while the communicator forms or splits is ncclInvalidArgument and does not stick",
          "[double][nccl]") {
  require_double();
  const auto before = segments();
  const ncclUniqueId id = new_id();
  ncclComm_t c0 = start_init(id, 2, 0, 0);  // rank 1 is not there yet
  DeviceBuffer<float> buf(8);
  CHECK(ncclAllReduce(buf.ptr, buf.ptr, 8, ncclFloat32, ncclSum, c0, nullptr) == ncclInvalidArgument);
  ncclComm_t child = nullptr;
  CHECK(ncclCommSplit(c0, 0, 0, &child, nullptr) == ncclInvalidArgument);
  ncclComm_t c1 = start_init(id, 2, 1, 1);
  CHECK(settle(c0) == ncclSuccess);  // the init's outcome stands
  CHECK(settle(c1) == ncclSuccess);
  // A split in progress (rank 1 has not proposed yet).
  CHECK(ncclCommSplit(c0, 0, 0, &child, nullptr) == ncclSuccess);
  CHECK(state_of(c0) == ncclInProgress);
  CHECK(ncclAllReduce(buf.ptr, buf.ptr, 8, ncclFloat32, ncclSum, c0, nullptr) == ncclInvalidArgument);
  ncclComm_t child1 = nullptr;
  cudaSetDevice(1);
  CHECK(ncclCommSplit(c1, 0, 0, &child1, nullptr) == ncclSuccess);
  cudaSetDevice(0);
  CHECK(settle(c0) == ncclSuccess);
  CHECK(settle(c1) == ncclSuccess);
  for (auto* c : {c0, c1, child, child1}) CHECK(ncclCommAbort(c) == ncclSuccess);
  CHECK(leftovers(before).empty());
}
