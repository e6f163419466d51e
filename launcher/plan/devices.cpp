#include "plan/devices.hpp"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace ddprun {
namespace {

// libcuda.so.1, loaded once and kept (unloading an initialised driver is not supported),
// or why it cannot be.
void* cuda_driver(std::string& error) {
  static std::string load_error;
  static void* lib = [] {
    void* l = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (l == nullptr) {
      const char* why = dlerror();
      load_error = std::string("no CUDA driver (") + (why ? why : "libcuda.so.1 not found") + ")";
    }
    return l;
  }();
  error = load_error;
  return lib;
}

}  // namespace

bool cuda_driver_present() {
  std::string error;
  return cuda_driver(error) != nullptr;
}

GpuCount count_gpus() {
  // Driver API entry points, declared here so the CUDA headers are not needed.
  using CuInit = int (*)(unsigned int);
  using CuDeviceGetCount = int (*)(int*);
  constexpr int kCudaErrorNoDevice = 100;

  std::string load_error;
  void* lib = cuda_driver(load_error);
  if (lib == nullptr) return {0, load_error};
  auto cu_init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto cu_count = reinterpret_cast<CuDeviceGetCount>(dlsym(lib, "cuDeviceGetCount"));
  if (cu_init == nullptr || cu_count == nullptr) return {0, "libcuda.so.1 lacks cuInit/cuDeviceGetCount"};
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
  return result;
}

std::vector<std::string> gpu_pci_addresses(std::string& error) {
  using CuDeviceGet = int (*)(int*, int);
  using CuDeviceGetAttribute = int (*)(int*, int, int);
  constexpr int kPciBusId = 33, kPciDeviceId = 34, kPciDomainId = 50;  // CU_DEVICE_ATTRIBUTE_PCI_*
  GpuCount gpus = count_gpus();
  if (!gpus.error.empty()) {
    error = gpus.error;
    return {};
  }
  void* lib = cuda_driver(error);
  auto cu_get = lib ? reinterpret_cast<CuDeviceGet>(dlsym(lib, "cuDeviceGet")) : nullptr;
  auto cu_attr = lib ? reinterpret_cast<CuDeviceGetAttribute>(dlsym(lib, "cuDeviceGetAttribute")) : nullptr;
  if (cu_get == nullptr || cu_attr == nullptr) {
    error = "libcuda.so.1 lacks cuDeviceGet/cuDeviceGetAttribute";
    return {};
  }
  std::vector<std::string> addresses;
  for (int i = 0; i < gpus.count; ++i) {
    int dev = 0, domain = 0, bus = 0, device = 0;
    int rc = cu_get(&dev, i);
    if (rc == 0) rc = cu_attr(&domain, kPciDomainId, dev);
    if (rc == 0) rc = cu_attr(&bus, kPciBusId, dev);
    if (rc == 0) rc = cu_attr(&device, kPciDeviceId, dev);
    if (rc != 0) {
      error = "cannot read GPU " + std::to_string(i) + "'s PCI address: CUDA error " + std::to_string(rc);
      return {};
    }
    char text[32];
    std::snprintf(text, sizeof(text), "%04x:%02x:%02x.0", domain, bus, device);
    addresses.emplace_back(text);
  }
  return addresses;
}

XpuCount count_xpus() {
  // Level Zero entry points (ze_api.h), declared here so its headers are not needed.
  using ZeInit = uint32_t (*)(uint32_t);
  using ZeDriverGet = uint32_t (*)(uint32_t*, void**);
  using ZeDeviceGet = uint32_t (*)(void*, uint32_t*, void**);
  constexpr uint32_t kGpuOnly = 1;  // ZE_INIT_FLAG_GPU_ONLY

  void* lib = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return {0, std::string("no Level Zero loader (") + (why ? why : "libze_loader.so.1 not found") + ")"};
  }
  auto ze_init = reinterpret_cast<ZeInit>(dlsym(lib, "zeInit"));
  auto ze_drivers = reinterpret_cast<ZeDriverGet>(dlsym(lib, "zeDriverGet"));
  auto ze_devices = reinterpret_cast<ZeDeviceGet>(dlsym(lib, "zeDeviceGet"));
  if (ze_init == nullptr || ze_drivers == nullptr || ze_devices == nullptr) {
    return {0, "libze_loader.so.1 lacks zeInit/zeDriverGet/zeDeviceGet"};
  }
  XpuCount result;
  uint32_t n_drivers = 0;
  if (uint32_t rc = ze_init(kGpuOnly); rc != 0) {
    result.error = "zeInit failed with Level Zero error " + std::to_string(rc);
  } else if ((rc = ze_drivers(&n_drivers, nullptr)) != 0) {
    result.error = "zeDriverGet failed with Level Zero error " + std::to_string(rc);
  } else {
    std::vector<void*> drivers(n_drivers);
    if (n_drivers > 0 && ze_drivers(&n_drivers, drivers.data()) == 0) {
      for (void* driver : drivers) {
        uint32_t n = 0;
        if (ze_devices(driver, &n, nullptr) == 0) result.count += static_cast<int>(n);
      }
    }
  }
  return result;  // the loader stays loaded, as the CUDA driver does
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
