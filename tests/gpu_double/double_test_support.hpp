// Helpers for the double's own tests: the check that the test runs under the
// double, ranks as forked processes or as communicators of one thread, re-running
// the test binary with other knobs, and /dev/shm bookkeeping.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "forked.hpp"
#include "gpu_double_check.hpp"
#include "subprocess.hpp"

namespace gpu_double_test {

using namespace std::chrono_literals;

// FAILs unless the process runs under the double (both libraries).
inline void require_double() {
  const std::string problem = gpu_double_check::problem();
  INFO(problem);
  REQUIRE(problem.empty());
}

// The double's own export `name` (tests link the real runtime's declarations only).
template <typename Fn>
Fn double_fn(const char* name) {
  auto* f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  INFO(name << " is not exported by the double");
  REQUIRE(f != nullptr);
  return f;
}

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

inline ncclUniqueId new_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

// Polls `done` every millisecond until it holds or `timeout` passes.
inline bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Whether `query` keeps answering cudaErrorNotReady for `span`.
inline bool stays_pending(const std::function<cudaError_t()>& query, std::chrono::milliseconds span) {
  return !eventually([&] { return query() != cudaErrorNotReady; }, span);
}

// Polls ncclCommGetAsyncError until it leaves ncclInProgress (or `timeout`).
inline ncclResult_t settle(ncclComm_t comm, std::chrono::milliseconds timeout = 30s) {
  ncclResult_t state = ncclInProgress;
  eventually(
      [&] {
        ncclCommGetAsyncError(comm, &state);
        return state != ncclInProgress;
      },
      timeout);
  return state;
}

// A non-blocking ncclCommInitRankConfig on `device` (made current).
inline ncclComm_t start_init(const ncclUniqueId& id, int nranks, int rank, int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (r != ncclInProgress && r != ncclSuccess) throw std::runtime_error("init answered " + std::to_string(r));
  return comm;
}

// `n` communicators of one id formed from this thread on devices 0..n-1 (every
// operation runs on its stream's thread, so one host thread can drive every rank).
inline std::vector<ncclComm_t> local_comms(int n) {
  const ncclUniqueId id = new_id();
  std::vector<ncclComm_t> comms;
  for (int r = 0; r < n; ++r) comms.push_back(start_init(id, n, r, r));
  for (auto* c : comms)
    if (settle(c) != ncclSuccess) throw std::runtime_error("init did not settle to ncclSuccess");
  return comms;
}

// Runs `body(rank, id)` in `n` forked processes (device = rank, not yet current)
// and returns what each returned; REQUIREs that every one succeeded.
inline std::vector<std::string> forked_ranks(int n, const std::function<std::string(int, ncclUniqueId)>& body,
                                             std::chrono::milliseconds timeout = 120s) {
  const ncclUniqueId id = new_id();
  std::vector<testing::ForkedChild> children;
  for (int r = 0; r < n; ++r) children.emplace_back([&, r] { return body(r, id); });
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    const auto result = children[r].wait(timeout);
    INFO("rank " << r << " (status " << result.status << "): " << result.payload);
    REQUIRE(result.ok);
    out.push_back(result.payload);
  }
  return out;
}

// The double's segments now in /dev/shm.
inline std::set<std::string> segments() {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("gpu_double_", 0) == 0) out.insert(name);
  }
  return out;
}

// Segments that appeared since `before` and are still there after a grace period
// (other processes on the machine may form communicators meanwhile: theirs go
// within milliseconds).
inline std::set<std::string> leftovers(const std::set<std::string>& before) {
  std::set<std::string> left;
  eventually(
      [&] {
        left.clear();
        for (const auto& s : segments())
          if (!before.count(s)) left.insert(s);
        return left.empty();
      },
      2s);
  return left;
}

// Runs the hidden test case `name` of this binary in a fresh process with `env`
// added (the knobs are read once per process); returns its exit status, its
// output in `output`.
inline int run_hidden(const std::string& name, const std::map<std::string, std::string>& env, std::string& output) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  testing::ProcessOptions options;
  options.set_env = env;
  auto r = testing::run({self, name}, options, 120s);
  output = r.out + r.err;
  return r.status;
}

// A host function that blocks its stream until release() (or the destructor).
struct Gate {
  std::promise<void> opened;
  std::shared_future<void> open = opened.get_future().share();
  bool released = false;
  static void wait(void* self) { static_cast<Gate*>(self)->open.wait(); }
  void block(cudaStream_t s) { check_cuda(cudaLaunchHostFunc(s, &Gate::wait, this), "cudaLaunchHostFunc"); }
  void release() {
    if (!released) opened.set_value();
    released = true;
  }
  ~Gate() { release(); }
};

// Device memory of `n` elements that frees itself.
template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t count) : n(count) { check_cuda(cudaMalloc(&ptr, n * sizeof(T)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& v) {
    check_cuda(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    check_cuda(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  T* ptr = nullptr;
  size_t n;
};

}  // namespace gpu_double_test
