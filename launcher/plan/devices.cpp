#include "plan/devices.hpp"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

namespace ddprun {

GpuCount count_gpus() {
  // Driver API entry points, declared here so the CUDA headers are not needed.
  using CuInit = int (*)(unsigned int);
  using CuDeviceGetCount = int (*)(int*);
  constexpr int kCudaErrorNoDevice = 100;

  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return {0, std::string("no CUDA driver (") + (why ? why : "libcuda.so.1 not found") + ")"};
  }
  auto cu_init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto cu_count = reinterpret_cast<CuDeviceGetCount>(dlsym(lib, "cuDeviceGetCount"));
  if (cu_init == nullptr || cu_count == nullptr) {
    dlclose(lib);
    return {0, "libcuda.so.1 lacks cuInit/cuDeviceGetCount"};
  }
  GpuCount result;
  int rc = cu_init(0);
  if (rc == kCudaErrorNoDevice) {
    result.count = 0;
  } else if (rc != 0) {
    result.error = "cuInit failed with CUDA error " + std::to_string(rc);
  } else if (int n = 0; (rc = cu_count(&n)) != 0) {
    result.error = "cuDeviceGetCount failed with CUDA error " + std::to_string(rc);
  } else {
    result.count = n;
  }
  // The driver stays loaded: unloading an initialised CUDA driver is not supported.
  return result;
}

int count_usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace ddprun
