// The CUDA runtime double: devices, errors, memory, stream order and asynchrony,
// events. Runs under the double (LD_LIBRARY_PATH); every case checks that first.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "double_test_support.hpp"

using namespace gpu_double_test;


TEST_CASE("the test runs under the double", "[double]") {
  require_double();
  using Version = const char* (*)();
  auto version = reinterpret_cast<Version>(dlsym(RTLD_DEFAULT, "gpu_double_version"));
  CHECK(std::string(version()).find("gpu double") != std::string::npos);
  int v = 0;
  CHECK(cudaRuntimeGetVersion(&v) == cudaSuccess);
  CHECK(v == CUDART_VERSION);
  CHECK(cudaDriverGetVersion(&v) == cudaSuccess);
  CHECK(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == NCCL_VERSION_CODE);
}

TEST_CASE("devices: count from the knob, the current device per thread, errors recorded per thread", "[double]") {
  require_double();
  int n = 0;
  REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
  CHECK(n == 4);  // GPU_DOUBLE_ENV sets DDP_GPU_DOUBLE_DEVICES=4
  REQUIRE(cudaSetDevice(3) == cudaSuccess);
  int d = -1;
  CHECK(cudaGetDevice(&d) == cudaSuccess);
  CHECK(d == 3);
  std::thread([] {
    int other = -1;
    cudaGetDevice(&other);
    CHECK(other == 0);  // a new thread starts on device 0
  }).join();

  CHECK(cudaSetDevice(4) == cudaErrorInvalidDevice);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);  // cleared
  CHECK(std::string(cudaGetErrorString(cudaErrorNotReady)) == "device not ready");
  CHECK(std::string(cudaGetErrorName(cudaErrorInvalidDevice)) == "cudaErrorInvalidDevice");
  cudaSetDevice(0);
}

TEST_CASE("memory: device pointers are recorded and host pointers are refused where device memory is due", "[double]") {
  require_double();
  cudaSetDevice(2);
  DeviceBuffer<int> buf(16);
  cudaPointerAttributes a{};
  REQUIRE(cudaPointerGetAttributes(&a, buf.ptr + 3) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeDevice);
  CHECK(a.device == 2);
  std::vector<int> host(16, 5);
  REQUIRE(cudaPointerGetAttributes(&a, host.data()) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeUnregistered);

  CHECK(cudaMemcpy(host.data(), host.data() + 1, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(buf.ptr, host.data(), 17 * sizeof(int), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemset(host.data(), 0, 4) == cudaErrorInvalidValue);
  CHECK(cudaFree(host.data()) == cudaErrorInvalidValue);
  cudaGetLastError();

  buf.upload(host);
  CHECK(cudaMemset(buf.ptr + 8, 0, 8 * sizeof(int)) == cudaSuccess);
  const auto back = buf.download();
  CHECK(back[7] == 5);
  CHECK(back[8] == 0);
  void* nothing = reinterpret_cast<void*>(1);
  CHECK(cudaMalloc(&nothing, 0) == cudaSuccess);
  CHECK(nothing == nullptr);
  cudaSetDevice(0);
}

TEST_CASE("streams: work is asynchronous and in order and an event is not ready while earlier work runs", "[double]") {
  require_double();
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  DeviceBuffer<int> buf(1024);
  std::vector<int> ones(1024, 1);
  buf.upload(std::vector<int>(1024, 0));
  cudaEvent_t before = nullptr, after = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&before, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreate(&after) == cudaSuccess);
  CHECK(cudaEventQuery(after) == cudaSuccess);  // never recorded: complete, as in CUDA

  Gate gate;
  REQUIRE(cudaEventRecord(before, s) == cudaSuccess);
  gate.block(s);
  REQUIRE(cudaMemcpyAsync(buf.ptr, ones.data(), 1024 * sizeof(int), cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(cudaEventRecord(after, s) == cudaSuccess);

  CHECK(eventually([&] { return cudaEventQuery(before) == cudaSuccess; }, 5s));
  CHECK(stays_pending([&] { return cudaEventQuery(after); }, 100ms));
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
  CHECK(cudaGetLastError() == cudaSuccess);  // NotReady is not an error

  gate.release();
  CHECK(cudaEventSynchronize(after) == cudaSuccess);
  CHECK(cudaEventQuery(after) == cudaSuccess);
  CHECK(cudaStreamQuery(s) == cudaSuccess);
  CHECK(buf.download() == ones);
  cudaEventDestroy(before);
  cudaEventDestroy(after);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("streams: cudaStreamWaitEvent orders one stream after a point of another", "[double]") {
  require_double();
  cudaStream_t a = nullptr, b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&b) == cudaSuccess);
  DeviceBuffer<int> src(256), dst(256);
  src.upload(std::vector<int>(256, 0));
  dst.upload(std::vector<int>(256, 9));
  cudaEvent_t filled = nullptr, copied = nullptr;
  cudaEventCreate(&filled);
  cudaEventCreate(&copied);

  cudaEvent_t before = nullptr;
  cudaEventCreate(&before);
  REQUIRE(cudaEventRecord(before, a) == cudaSuccess);
  Gate gate;
  gate.block(a);
  REQUIRE(cudaMemsetAsync(src.ptr, 1, 256 * sizeof(int), a) == cudaSuccess);
  REQUIRE(cudaEventRecord(filled, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, filled, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(dst.ptr, src.ptr, 256 * sizeof(int), cudaMemcpyDeviceToDevice, b) == cudaSuccess);
  REQUIRE(cudaEventRecord(copied, b) == cudaSuccess);

  CHECK(stays_pending([&] { return cudaEventQuery(copied); }, 100ms));
  gate.release();
  CHECK(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(dst.download() == std::vector<int>(256, 0x01010101));
  // The gate held stream a for the 100 ms above: the events measure it.
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, before, filled) == cudaSuccess);
  CHECK(ms >= 90);
  CHECK(cudaEventElapsedTime(&ms, filled, copied) == cudaSuccess);
  CHECK(ms < 90);
  cudaEventDestroy(before);
  cudaEventDestroy(filled);
  cudaEventDestroy(copied);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("streams: cudaMemcpy waits for the legacy stream and blocking streams sync with it", "[double]") {
  require_double();
  DeviceBuffer<int> buf(64);
  buf.upload(std::vector<int>(64, 0));
  {
    Gate gate;
    gate.block(nullptr);  // the legacy default stream
    REQUIRE(cudaMemsetAsync(buf.ptr, 2, 64 * sizeof(int), nullptr) == cudaSuccess);
    std::thread opener([&] {
      std::this_thread::sleep_for(50ms);
      gate.release();
    });
    const auto v = buf.download();  // cudaMemcpy: after the memset
    opener.join();
    CHECK(v == std::vector<int>(64, 0x02020202));
  }
  // Work on a blocking stream is seen by a later cudaMemcpy (the legacy stream waits for it).
  cudaStream_t blocking = nullptr;
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  Gate gate;
  gate.block(blocking);
  REQUIRE(cudaMemsetAsync(buf.ptr, 3, 64 * sizeof(int), blocking) == cudaSuccess);
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    gate.release();
  });
  const auto v = buf.download();
  opener.join();
  CHECK(v == std::vector<int>(64, 0x03030303));
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  cudaStreamDestroy(blocking);
}

TEST_CASE("memory: cudaFree with work still queued returns at once and the pointer is no longer device memory",
          "[double]") {
  require_double();
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 1 << 20) == cudaSuccess);
  Gate gate;
  gate.block(s);
  REQUIRE(cudaMemsetAsync(p, 1, 1 << 20, s) == cudaSuccess);  // still queued behind the gate
  CHECK(cudaFree(p) == cudaSuccess);                           // does not wait for it
  cudaPointerAttributes a{};
  REQUIRE(cudaPointerGetAttributes(&a, p) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeUnregistered);
  CHECK(cudaMemset(p, 0, 16) == cudaErrorInvalidValue);
  cudaGetLastError();
  auto pending = double_fn<int (*)()>("gpu_double_pending_frees");
  const int waiting = pending();
  CHECK(waiting >= 1);  // deferred, not released at once
  gate.release();  // the memset runs on memory the double has not released yet
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  void* q = nullptr;
  REQUIRE(cudaMalloc(&q, 16) == cudaSuccess);
  CHECK(cudaFree(q) == cudaSuccess);  // and this one releases the first
  CHECK(pending() < waiting);
  cudaStreamDestroy(s);
}

TEST_CASE("memory: the host cannot touch device memory, peek/poke can, and a forked child gets a copy", "[double]") {
  require_double();
  auto peek = double_fn<int (*)(void*, const void*, size_t)>("gpu_double_peek");
  auto poke = double_fn<int (*)(void*, const void*, size_t)>("gpu_double_poke");
  DeviceBuffer<int> buf(4);
  buf.upload({1, 2, 3, 4});
  int v = 0;
  CHECK(peek(&v, buf.ptr + 2, sizeof v) == 0);
  CHECK(v == 3);
  const int nine = 9;
  CHECK(poke(buf.ptr + 1, &nine, sizeof nine) == 0);
  CHECK(buf.download() == std::vector<int>{1, 9, 3, 4});
  CHECK(peek(&v, &nine, sizeof v) == -1);  // not device memory
  // A host read of a device pointer faults, as on a GPU.
  const pid_t reader = fork();
  if (reader == 0) {
    volatile int got = *const_cast<volatile int*>(buf.ptr);
    _exit(got == 1 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(reader, &status, 0) == reader);
  CHECK(WIFSIGNALED(status));
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV));
  // A child's writes stay its own (as a fork of plain memory would).
  const pid_t writer = fork();
  if (writer == 0) {
    const int zero = 0;
    std::vector<int> seen(4);
    const bool ok = poke(buf.ptr, &zero, sizeof zero) == 0 &&
                    cudaMemcpy(seen.data(), buf.ptr, sizeof(int) * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
                    seen == std::vector<int>{0, 9, 3, 4};
    _exit(ok ? 0 : 1);
  }
  REQUIRE(waitpid(writer, &status, 0) == writer);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(buf.download() == std::vector<int>{1, 9, 3, 4});
}

TEST_CASE("check: without the double on the path", "[.]") {
  // Run with LD_LIBRARY_PATH unset: the real libraries load, and the check says so.
  const std::string problem = gpu_double_check::problem();
  CHECK(problem.find("not the double") != std::string::npos);
}

TEST_CASE("check: gpu_double_check tells the real libraries from the double", "[double]") {
  require_double();
  CHECK(gpu_double_check::problem().empty());
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  testing::ProcessOptions options;
  options.unset_env = {"LD_LIBRARY_PATH"};
  auto r = testing::run({self, "check: without the double on the path"}, options, 60s);
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK(r.out.find("All tests passed") != std::string::npos);
}

TEST_CASE("streams: a non-blocking stream does not wait for legacy work, a blocking one does", "[double]") {
  require_double();
  DeviceBuffer<int> buf(16);
  buf.upload(std::vector<int>(16, 0));
  cudaStream_t free_running = nullptr, blocking = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&free_running, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  Gate gate;
  gate.block(nullptr);  // legacy work that does not finish until released
  REQUIRE(cudaMemsetAsync(buf.ptr, 1, 16 * sizeof(int), free_running) == cudaSuccess);
  CHECK(cudaStreamSynchronize(free_running) == cudaSuccess);  // ran past the gated legacy stream
  REQUIRE(cudaMemsetAsync(buf.ptr, 2, 16 * sizeof(int), blocking) == cudaSuccess);
  REQUIRE(cudaEventRecord(done, blocking) == cudaSuccess);
  CHECK(stays_pending([&] { return cudaEventQuery(done); }, 100ms));  // waits for the legacy work
  gate.release();
  CHECK(cudaEventSynchronize(done) == cudaSuccess);
  CHECK(buf.download() == std::vector<int>(16, 0x02020202));
  cudaEventDestroy(done);
  cudaStreamDestroy(free_running);
  cudaStreamDestroy(blocking);
}
