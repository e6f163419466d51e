// The double's knobs: each fault of DDP_GPU_DOUBLE_FAULTS, DDP_GPU_DOUBLE_DEVICES=0
// and the trace. The knobs are read once per process, so each is a hidden test case
// ("[.]") that the runner at the end starts in a fresh process of this binary.
#include "double_test_support.hpp"

using namespace gpu_double_test;

namespace {

// An all_reduce of one float on `comm` (device = its rank) followed by an event.
struct Launched {
  ncclResult_t result = ncclInternalError;
  cudaEvent_t done = nullptr;
};

Launched all_reduce(ncclComm_t comm, int device, float* buf) {
  cudaSetDevice(device);
  Launched l;
  cudaEventCreateWithFlags(&l.done, cudaEventDisableTiming);
  l.result = ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, nullptr);
  cudaEventRecord(l.done, nullptr);
  return l;
}

bool fired(const Launched& l) {
  return eventually([&] { return cudaEventQuery(l.done) != cudaErrorNotReady; }, 5s);
}

ncclResult_t state_of(ncclComm_t comm) {
  ncclResult_t s = ncclInternalError;
  ncclCommGetAsyncError(comm, &s);
  return s;
}

bool accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

// Two ranks' device floats.
struct Floats {
  Floats() {
    for (int r = 0; r < 2; ++r) {
      cudaSetDevice(r);
      check_cuda(cudaMalloc(&at[r], sizeof(float)), "cudaMalloc");
    }
    cudaSetDevice(0);
  }
  float* at[2] = {nullptr, nullptr};
};

// An all_reduce on both ranks that is accepted and completes.
bool one_good_call(const std::vector<ncclComm_t>& comms, Floats& f) {
  auto a = all_reduce(comms[0], 0, f.at[0]);
  auto b = all_reduce(comms[1], 1, f.at[1]);
  return accepted(a.result) && accepted(b.result) && fired(a) && fired(b);
}

// Starts the non-blocking init of ranks 0 and 1 (devices 0 and 1) of a new id.
std::pair<ncclComm_t, ncclComm_t> start_two() {
  const ncclUniqueId id = new_id();
  ncclComm_t c0 = start_init(id, 2, 0, 0);
  return {c0, start_init(id, 2, 1, 1)};
}

}  // namespace

TEST_CASE("fault: init_hang", "[.]") {
  require_double();
  const auto before = segments();
  auto [c0, c1] = start_two();  // init_hang@1
  CHECK(settle(c1, 300ms) == ncclInProgress);
  CHECK(settle(c0, 10ms) == ncclInProgress);  // its peer never joins
  ncclCommAbort(c0);
  ncclCommAbort(c1);
  CHECK(leftovers(before).empty());
}

TEST_CASE("fault: init_error", "[.]") {
  require_double();
  const auto before = segments();
  auto [c0, c1] = start_two();  // init_error@1
  CHECK(settle(c1) == ncclSystemError);
  CHECK(settle(c0, 100ms) == ncclInProgress);
  ncclCommAbort(c0);
  ncclCommAbort(c1);
  ncclComm_t blocking = nullptr;
  CHECK(ncclCommInitRank(&blocking, 2, new_id(), 1) == ncclSystemError);
  CHECK(blocking == nullptr);
  CHECK(leftovers(before).empty());
}

TEST_CASE("fault: unique_id_error", "[.]") {
  require_double();
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id) == ncclSystemError);
}

TEST_CASE("fault: async_error", "[.]") {
  require_double();
  auto comms = local_comms(2);  // async_error@0=1
  Floats f;
  REQUIRE(one_good_call(comms, f));
  CHECK(state_of(comms[0]) == ncclSuccess);
  auto c = all_reduce(comms[0], 0, f.at[0]);  // call 2: accepted, never completes
  auto d = all_reduce(comms[1], 1, f.at[1]);
  CHECK(c.result == ncclSuccess);
  CHECK(state_of(comms[0]) == ncclRemoteError);
  CHECK(state_of(comms[1]) == ncclSuccess);
  CHECK(stays_pending([&] { return cudaEventQuery(c.done); }, 200ms));
  CHECK(cudaEventQuery(d.done) == cudaErrorNotReady);
  CHECK(all_reduce(comms[0], 0, f.at[0]).result == ncclRemoteError);
  ncclCommAbort(comms[0]);
  ncclCommAbort(comms[1]);
  CHECK((fired(c) && fired(d)));
}

TEST_CASE("fault: enqueue_error", "[.]") {
  require_double();
  auto comms = local_comms(2);  // enqueue_error@1=1
  Floats f;
  REQUIRE(one_good_call(comms, f));
  auto c = all_reduce(comms[0], 0, f.at[0]);
  CHECK(all_reduce(comms[1], 1, f.at[1]).result == ncclSystemError);
  CHECK(all_reduce(comms[1], 1, f.at[1]).result == ncclSystemError);  // and every later call
  CHECK(stays_pending([&] { return cudaEventQuery(c.done); }, 100ms));
  ncclCommAbort(comms[0]);
  ncclCommAbort(comms[1]);
  CHECK(fired(c));
}

TEST_CASE("fault: enqueue_pending", "[.]") {
  require_double();
  auto comms = local_comms(2);  // enqueue_pending (every rank, first call)
  Floats f;
  CHECK(all_reduce(comms[0], 0, f.at[0]).result == ncclInProgress);
  CHECK(settle(comms[0], 200ms) == ncclInProgress);
  ncclCommAbort(comms[0]);
  ncclCommAbort(comms[1]);
}

TEST_CASE("fault: event_error", "[.]") {
  require_double();
  auto comms = local_comms(2);  // event_error@0
  Floats f;
  auto a = all_reduce(comms[0], 0, f.at[0]);
  auto b = all_reduce(comms[1], 1, f.at[1]);
  CHECK(accepted(a.result));
  CHECK(eventually([&] { return cudaEventQuery(a.done) == cudaErrorLaunchFailure; }, 5s));
  cudaSetDevice(0);
  CHECK(cudaStreamQuery(nullptr) == cudaErrorLaunchFailure);  // sticky on device 0
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(stays_pending([&] { return cudaEventQuery(b.done); }, 100ms));  // its peer never sent
  ncclCommAbort(comms[0]);
  ncclCommAbort(comms[1]);
  CHECK(fired(b));
  cudaSetDevice(1);
  CHECK(cudaEventQuery(b.done) == cudaSuccess);  // device 1 is fine
}

TEST_CASE("fault: split_error", "[.]") {
  require_double();
  auto comms = local_comms(2);  // split_error@1
  ncclComm_t child[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) CHECK(ncclCommSplit(comms[r], 0, r, &child[r], nullptr) == ncclSuccess);
  CHECK(settle(comms[1]) == ncclSystemError);
  CHECK(child[1] == nullptr);
  CHECK(settle(comms[0], 100ms) == ncclInProgress);  // rank 1 never proposed
  // Abort ends rank 0's split waiting for rank 1 at once.
  const auto start = std::chrono::steady_clock::now();
  ncclCommAbort(comms[0]);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  ncclCommAbort(comms[1]);
}

TEST_CASE("fault: split_hang", "[.]") {
  require_double();
  auto comms = local_comms(2);  // split_hang
  ncclComm_t child[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) CHECK(ncclCommSplit(comms[r], 0, r, &child[r], nullptr) == ncclSuccess);
  CHECK(settle(comms[0], 300ms) == ncclInProgress);
  CHECK(settle(comms[1], 10ms) == ncclInProgress);
  ncclCommAbort(comms[0]);
  ncclCommAbort(comms[1]);
  CHECK((child[0] == nullptr && child[1] == nullptr));
}

TEST_CASE("fault: stream_error", "[.]") {
  require_double();
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaErrorMemoryAllocation);
  CHECK(cudaStreamCreate(&s) == cudaErrorMemoryAllocation);
}

TEST_CASE("fault: stream_error of another rank", "[.]") {
  require_double();
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);  // stream_error@1 with RANK=0
  cudaStreamDestroy(s);
}

TEST_CASE("knob: no devices", "[.]") {
  require_double();
  int n = -1;
  CHECK(cudaGetDeviceCount(&n) == cudaErrorNoDevice);
  CHECK(n == 0);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 16) == cudaErrorNoDevice);
  CHECK(cudaSetDevice(0) == cudaErrorNoDevice);
}

TEST_CASE("knob: trace", "[.]") {
  require_double();
  auto comms = local_comms(2);
  for (auto* c : comms) ncclCommAbort(c);
}

TEST_CASE("knob: delay", "[.]") {
  require_double();  // DDP_GPU_DOUBLE_DELAY_US=20000: 20 tasks take about 200 ms
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  DeviceBuffer<int> buf(4);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) REQUIRE(cudaMemsetAsync(buf.ptr, i, 4 * sizeof(int), s) == cudaSuccess);
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(std::chrono::steady_clock::now() - start > 50ms);  // 20 random pauses of 0..20 ms
  CHECK(buf.download() == std::vector<int>(4, 0x13131313));
  cudaStreamDestroy(s);
}

TEST_CASE("faults: every knob behaves as gpu_double.hpp says, each in a fresh process", "[double][faults]") {
  require_double();
  struct Case {
    const char* test;
    std::map<std::string, std::string> env;
    const char* must_print = nullptr;
  };
  const Case cases[] = {
      {"fault: init_hang", {{"DDP_GPU_DOUBLE_FAULTS", "init_hang@1"}}},
      {"fault: init_error", {{"DDP_GPU_DOUBLE_FAULTS", "init_error@1"}}},
      {"fault: unique_id_error", {{"DDP_GPU_DOUBLE_FAULTS", "unique_id_error"}}},
      {"fault: async_error", {{"DDP_GPU_DOUBLE_FAULTS", "async_error@0=1"}}},
      {"fault: enqueue_error", {{"DDP_GPU_DOUBLE_FAULTS", "enqueue_error@1=1"}}},
      {"fault: enqueue_pending", {{"DDP_GPU_DOUBLE_FAULTS", "enqueue_pending"}}},
      {"fault: event_error", {{"DDP_GPU_DOUBLE_FAULTS", "event_error@0"}}},
      {"fault: split_error", {{"DDP_GPU_DOUBLE_FAULTS", "split_error@1"}}},
      {"fault: split_hang", {{"DDP_GPU_DOUBLE_FAULTS", "split_hang"}}},
      {"fault: stream_error", {{"DDP_GPU_DOUBLE_FAULTS", "stream_error@1"}, {"RANK", "1"}}},
      {"fault: stream_error of another rank", {{"DDP_GPU_DOUBLE_FAULTS", "stream_error@1"}, {"RANK", "0"}}},
      {"knob: no devices", {{"DDP_GPU_DOUBLE_DEVICES", "0"}}},
      {"knob: trace", {{"DDP_GPU_DOUBLE_TRACE", "1"}}, "ncclCommInitRankConfig (non-blocking)"},
      {"knob: trace", {{"DDP_GPU_DOUBLE_FAULTS", "no_such_fault"}}, "ignoring 'no_such_fault'"},
      {"knob: delay", {{"DDP_GPU_DOUBLE_DELAY_US", "20000"}}},
      {"knob: trace", {{"DDP_GPU_DOUBLE_DELAY_US", "soon"}}, "DDP_GPU_DOUBLE_DELAY_US=soon is not"},
  };
  for (const Case& c : cases) {
    std::string output;
    const int status = run_hidden(c.test, c.env, output);
    INFO(c.test << " exited " << status << ":\n" << output);
    CHECK(status == 0);
    CHECK(output.find("All tests passed") != std::string::npos);  // it ran (a wrong name runs nothing)
    if (c.must_print != nullptr) CHECK(output.find(c.must_print) != std::string::npos);
  }
}
