// nccl_semantics_probe: the facts about NCCL and the CUDA runtime that the GPU double
// copies and that were seen on a real GPU (an H200, NCCL 2.28.9), checked in one
// program. CI runs it under the double (the double must keep them); scripts/gpu-check
// runs it against the real libraries (a new NCCL must still have them, or the double
// is out of date). One rank on device 0; prints one PASS/FAIL line per fact and exits
// 0 when every fact holds, 1 when one does not, 2 when no device is usable.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace {

int failures = 0;

void fact(bool holds, const char* what, int got) {
  std::printf("%s %s (got %d)\n", holds ? "PASS" : "FAIL", what, got);
  if (!holds) ++failures;
}

// Polls a non-blocking communicator until its state leaves ncclInProgress (10 s at most).
ncclResult_t settle(ncclComm_t c, ncclResult_t r) {
  for (int i = 0; i < 100000 && r == ncclInProgress; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (ncclCommGetAsyncError(c, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

ncclComm_t one_rank(bool blocking) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  ncclComm_t c = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&c, 1, id, 0, &config);
  if (!blocking) {
    fact(r == ncclInProgress || r == ncclSuccess, "non-blocking init answers ncclInProgress or ncclSuccess", r);
    r = settle(c, r);
  }
  fact(r == ncclSuccess, blocking ? "blocking init succeeds" : "non-blocking init settles to ncclSuccess", r);
  return r == ncclSuccess ? c : nullptr;
}

ncclResult_t async_state(ncclComm_t c) {
  ncclResult_t state = ncclInternalError;
  if (ncclCommGetAsyncError(c, &state) != ncclSuccess) return ncclInternalError;
  return state;
}

const auto kBadType = static_cast<ncclDataType_t>(99);

void refusals(bool blocking, float* buf, cudaStream_t s) {
  ncclComm_t c = one_rank(blocking);
  if (c == nullptr) return;
  ncclResult_t r = ncclAllReduce(buf, buf, 256, kBadType, ncclSum, c, s);
  fact(r == ncclInvalidArgument, "an all_reduce of an unknown dtype is refused with ncclInvalidArgument", r);
  if (blocking) {
    fact(async_state(c) == ncclSuccess, "a blocking communicator's state stays ncclSuccess after a refusal",
         async_state(c));
    r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, c, s);
    fact(r == ncclSuccess, "a blocking communicator takes a valid call after a refusal", r);
  } else {
    fact(async_state(c) == ncclInvalidArgument,
         "a non-blocking communicator keeps the refusal as its async error", async_state(c));
    r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, c, s);
    fact(r == ncclInvalidArgument, "a non-blocking communicator refuses every later call", r);
  }
  ncclCommAbort(c);

  c = one_rank(blocking);
  if (c == nullptr) return;
  ncclGroupStart();
  ncclResult_t good = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, c, s);
  ncclResult_t bad = ncclAllReduce(buf, buf, 256, kBadType, ncclSum, c, s);
  r = ncclGroupEnd();
  fact(good == ncclSuccess && bad == ncclInvalidArgument, "inside a group the bad call alone is refused",
       good * 100 + bad);
  fact(r == ncclInvalidArgument, "ncclGroupEnd of a group with a refused call answers ncclInvalidArgument", r);
  ncclCommAbort(c);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 || cudaSetDevice(0) != cudaSuccess) {
    std::printf("nccl_semantics_probe: no usable CUDA device\n");
    return 2;
  }
  float* buf = nullptr;
  cudaStream_t s = nullptr;
  if (cudaMalloc(&buf, 256 * sizeof(float)) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    std::printf("nccl_semantics_probe: cudaMalloc or cudaStreamCreateWithFlags failed\n");
    return 2;
  }
  refusals(/*blocking=*/false, buf, s);
  refusals(/*blocking=*/true, buf, s);
  fact(cudaStreamSynchronize(s) == cudaSuccess, "the stream is healthy after the refusals",
       cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
  cudaFree(buf);
  std::printf("nccl_semantics_probe: %d fact(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
