// Where the double is as strict as a GPU: cudaMemset and device-to-device copies do
// not block the host, a kernel fault is answered by every later call and cannot be
// cleared, and one communicator's operations run in issue order across streams.
#include <atomic>

#include "double_test_support.hpp"

using namespace gpu_double_test;

TEST_CASE("strict: cudaMemset and a device-to-device cudaMemcpy return while the legacy stream is busy",
          "[double]") {
  require_double();
  DeviceBuffer<int> a(64), b(64);
  a.upload(std::vector<int>(64, 0));
  b.upload(std::vector<int>(64, 0));
  Gate gate;
  gate.block(nullptr);
  // Both would hang here if they waited for the gated legacy stream.
  CHECK(cudaMemset(a.ptr, 7, 64 * sizeof(int)) == cudaSuccess);
  CHECK(cudaMemcpy(b.ptr, a.ptr, 64 * sizeof(int), cudaMemcpyDeviceToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(b.ptr, a.ptr, 64 * sizeof(int), cudaMemcpyDefault) == cudaSuccess);
  CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    gate.release();
  });
  CHECK(b.download() == std::vector<int>(64, 0x07070707));  // device to host waits for all of it
  opener.join();
}

TEST_CASE("strict: after a kernel fault every call answers it, it cannot be cleared, and skipped work is freed",
          "[double]") {
  require_double();
  auto fault_device = double_fn<int (*)(int)>("gpu_double_fault_device");
  auto launch = double_fn<int (*)(cudaStream_t, void (*)(void*), void*, void (*)(void*))>(
      "gpu_double_launch_host_func");
  check_cuda(cudaSetDevice(3), "cudaSetDevice");  // only this test's process uses it
  DeviceBuffer<int> buf(16);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  struct Counts {
    std::atomic<int> ran{0}, dropped{0};
  } counts;
  auto run = [](void* c) { ++static_cast<Counts*>(c)->ran; };
  auto drop = [](void* c) { ++static_cast<Counts*>(c)->dropped; };
  {
    Gate gate;
    gate.block(s);
    REQUIRE(launch(s, run, &counts, drop) == cudaSuccess);  // queued before the fault
    REQUIRE(launch(s, run, &counts, drop) == cudaSuccess);
    fault_device(3);
    gate.release();
    CHECK(cudaStreamSynchronize(s) == cudaErrorLaunchFailure);
  }
  CHECK(counts.ran.load() == 0);      // nothing ran after the fault
  CHECK(counts.dropped.load() == 2);  // and what was skipped was handed back, not leaked
  CHECK(launch(s, run, &counts, drop) == cudaErrorLaunchFailure);
  CHECK(counts.dropped.load() == 3);  // refused at once: dropped too
  const cudaError_t kFault = cudaErrorLaunchFailure;
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 16) == kFault);
  CHECK(cudaMemsetAsync(buf.ptr, 0, 16, s) == kFault);
  CHECK(cudaMemset(buf.ptr, 0, 16) == kFault);
  CHECK(cudaMemcpyAsync(buf.ptr, buf.ptr, 16, cudaMemcpyDeviceToDevice, s) == kFault);
  std::vector<int> host(16);
  CHECK(cudaMemcpy(host.data(), buf.ptr, 16, cudaMemcpyDeviceToHost) == kFault);
  CHECK(cudaEventRecord(e, s) == kFault);
  CHECK(cudaStreamWaitEvent(s, e, 0) == kFault);
  CHECK(cudaLaunchHostFunc(s, run, &counts) == kFault);
  cudaStream_t t = nullptr;
  CHECK(cudaStreamCreate(&t) == kFault);
  cudaEvent_t f = nullptr;
  CHECK(cudaEventCreate(&f) == kFault);
  CHECK(cudaGetLastError() == kFault);
  CHECK(cudaGetLastError() == kFault);  // sticky: not cleared
  CHECK(cudaPeekAtLastError() == kFault);
  CHECK(cudaDeviceSynchronize() == kFault);
  CHECK(counts.ran.load() == 0);
  // Another device is not affected.
  check_cuda(cudaSetDevice(2), "cudaSetDevice");
  cudaGetLastError();
  CHECK(cudaGetLastError() == cudaSuccess);
  void* q = nullptr;
  CHECK(cudaMalloc(&q, 16) == cudaSuccess);
  CHECK(cudaFree(q) == cudaSuccess);
  check_cuda(cudaSetDevice(3), "cudaSetDevice");
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

TEST_CASE("strict: one communicator's operations run in issue order across streams", "[double][nccl]") {
  require_double();
  const auto before = segments();
  auto comms = local_comms(2);
  std::vector<std::unique_ptr<DeviceBuffer<int>>> first, second;
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    first.push_back(std::make_unique<DeviceBuffer<int>>(4));
    second.push_back(std::make_unique<DeviceBuffer<int>>(4));
    first[r]->upload(std::vector<int>(4, 1 + r));      // sums to 3
    second[r]->upload(std::vector<int>(4, 10 + 10 * r));  // sums to 30
  }
  cudaSetDevice(0);
  cudaStream_t s1 = nullptr, s2 = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  Gate gate;
  gate.block(s1);
  // Rank 0: the first all_reduce on the gated s1, the second on s2.
  const ncclResult_t a = ncclAllReduce(first[0]->ptr, first[0]->ptr, 4, ncclInt32, ncclSum, comms[0], s1);
  const ncclResult_t b = ncclAllReduce(second[0]->ptr, second[0]->ptr, 4, ncclInt32, ncclSum, comms[0], s2);
  CHECK((a == ncclSuccess || a == ncclInProgress));
  CHECK(b == ncclSuccess);
  REQUIRE(cudaEventRecord(done, s2) == cudaSuccess);
  // Rank 1 issues both on its legacy stream. Run out of order, rank 0's second
  // would meet rank 1's first and both would get wrong sums.
  cudaSetDevice(1);
  for (auto* buf : {first[1]->ptr, second[1]->ptr}) {
    const ncclResult_t r = ncclAllReduce(buf, buf, 4, ncclInt32, ncclSum, comms[1], nullptr);
    CHECK((r == ncclSuccess || r == ncclInProgress));
  }
  CHECK(stays_pending([&] { return cudaEventQuery(done); }, 100ms));  // s2 waits for s1's call
  gate.release();
  CHECK(cudaEventSynchronize(done) == cudaSuccess);
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    CHECK(first[r]->download() == std::vector<int>(4, 3));
    CHECK(second[r]->download() == std::vector<int>(4, 30));
  }
  cudaSetDevice(0);
  for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
  cudaEventDestroy(done);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  CHECK(leftovers(before).empty());
}

TEST_CASE("strict: abort ends a finalize waiting behind other work on the stream", "[double][nccl]") {
  require_double();
  const auto before = segments();
  auto comms = local_comms(2);
  cudaSetDevice(0);
  DeviceBuffer<float> buf(4);
  Gate gate;
  gate.block(nullptr);  // device 0's legacy stream, where the all_reduce goes
  const ncclResult_t r = ncclAllReduce(buf.ptr, buf.ptr, 4, ncclFloat32, ncclSum, comms[0], nullptr);
  CHECK((r == ncclSuccess || r == ncclInProgress));
  CHECK(ncclCommFinalize(comms[0]) == ncclInProgress);  // its flush waits behind the gate
  std::thread opener([&] {  // so that a regression fails instead of hanging
    std::this_thread::sleep_for(3s);
    gate.release();
  });
  const auto start = std::chrono::steady_clock::now();
  CHECK(ncclCommAbort(comms[0]) == ncclSuccess);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  opener.join();
  CHECK(ncclCommAbort(comms[1]) == ncclSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(leftovers(before).empty());
}

TEST_CASE("strict: a group on several streams waits for each stream and each stream's later work waits for it",
          "[double][nccl]") {
  require_double();
  const auto before = segments();
  auto comms = local_comms(2);
  std::vector<std::unique_ptr<DeviceBuffer<int>>> a, b;
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    a.push_back(std::make_unique<DeviceBuffer<int>>(4));
    b.push_back(std::make_unique<DeviceBuffer<int>>(4));
    a[r]->upload(std::vector<int>(4, 1));
    b[r]->upload(std::vector<int>(4, 5));
  }
  cudaSetDevice(0);
  cudaStream_t s1 = nullptr, s2 = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t on_s1 = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&on_s1, cudaEventDisableTiming) == cudaSuccess);
  Gate gate;
  gate.block(s2);  // the group's second stream is busy
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclAllReduce(a[0]->ptr, a[0]->ptr, 4, ncclInt32, ncclSum, comms[0], s1) == ncclSuccess);
  CHECK(ncclAllReduce(b[0]->ptr, b[0]->ptr, 4, ncclInt32, ncclSum, comms[0], s2) == ncclSuccess);
  cudaSetDevice(1);
  CHECK(ncclAllReduce(a[1]->ptr, a[1]->ptr, 4, ncclInt32, ncclSum, comms[1], nullptr) == ncclSuccess);
  CHECK(ncclAllReduce(b[1]->ptr, b[1]->ptr, 4, ncclInt32, ncclSum, comms[1], nullptr) == ncclSuccess);
  cudaSetDevice(0);
  const ncclResult_t end = ncclGroupEnd();
  CHECK((end == ncclSuccess || end == ncclInProgress));
  REQUIRE(cudaEventRecord(on_s1, s1) == cudaSuccess);
  CHECK(stays_pending([&] { return cudaEventQuery(on_s1); }, 100ms));  // s1 waits for the group on s2
  gate.release();
  CHECK(cudaEventSynchronize(on_s1) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s2) == cudaSuccess);
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    CHECK(a[r]->download() == std::vector<int>(4, 2));
    CHECK(b[r]->download() == std::vector<int>(4, 10));
  }
  cudaSetDevice(0);
  for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
  cudaEventDestroy(on_s1);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  CHECK(leftovers(before).empty());
}

TEST_CASE("strict: aborting the parent during a split ends it and gives no child", "[double][nccl]") {
  require_double();
  const auto before = segments();
  auto comms = local_comms(2);
  ncclComm_t child = nullptr;
  CHECK(ncclCommSplit(comms[0], 0, 0, &child, nullptr) == ncclSuccess);  // rank 1 never splits
  ncclResult_t state = ncclInternalError;
  ncclCommGetAsyncError(comms[0], &state);
  CHECK(state == ncclInProgress);
  const auto start = std::chrono::steady_clock::now();
  CHECK(ncclCommAbort(comms[0]) == ncclSuccess);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  CHECK(child == nullptr);
  CHECK(ncclCommAbort(comms[1]) == ncclSuccess);
  CHECK(leftovers(before).empty());
}
