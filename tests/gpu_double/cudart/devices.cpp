// The CUDA runtime double: devices, versions, errors and the double's own marker.
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <mutex>

#include "../common/fork_safe.hpp"
#include "../common/knobs.hpp"
#include "../gpu_double.hpp"
#include "state.hpp"

namespace gpu_double {
namespace {

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

struct Sticky {
  std::mutex mu;
  std::vector<cudaError_t> errors;  // per device
};
Sticky& sticky() { return ForkSafe<Sticky>::get(); }

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};

// The texts are those the real runtime prints for these codes.
constexpr std::array<ErrorText, 10> kErrors{{
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
}};

const ErrorText* find_error(cudaError_t e) {
  for (const auto& t : kErrors)
    if (t.code == e) return &t;
  return nullptr;
}

}  // namespace

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}

cudaError_t sticky_fail(int device) { return fail(sticky_error(device)); }

int current_device() { return t_device; }
int device_count() { return knobs().devices; }

cudaError_t sticky_error(int device) {
  std::lock_guard lock(sticky().mu);
  auto& v = sticky().errors;
  return device >= 0 && static_cast<size_t>(device) < v.size() ? v[device] : cudaSuccess;
}

void set_sticky_error(int device, cudaError_t e) {
  std::lock_guard lock(sticky().mu);
  auto& v = sticky().errors;
  if (device < 0) return;
  if (static_cast<size_t>(device) >= v.size()) v.resize(device + 1, cudaSuccess);
  if (v[device] == cudaSuccess) v[device] = e;
}

}  // namespace gpu_double

using namespace gpu_double;

extern "C" {

// The double's marker: tests look it up with dlsym to know they run under it.
__attribute__((visibility("default"))) const char* gpu_double_version() { return "ddprun gpu double 1"; }

// Fails `device` as a kernel fault does: its sticky error becomes
// cudaErrorLaunchFailure. The NCCL double calls it from a task on the stream.
__attribute__((visibility("default"))) int gpu_double_fault_device(int device) {
  set_sticky_error(device, cudaErrorLaunchFailure);
  return 0;
}

}  // extern "C"

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 0;
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  const int device = t_device;
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  synchronize_device(device);
  return fail(sticky_error(device));
}

// A sticky error (kernel fault) cannot be cleared: both answer it for good.
cudaError_t cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  const cudaError_t sticky = sticky_error(t_device);
  return sticky != cudaSuccess ? sticky : e;
}

cudaError_t cudaPeekAtLastError() {
  const cudaError_t sticky = sticky_error(t_device);
  return sticky != cudaSuccess ? sticky : t_last_error;
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* t = find_error(error);
  return t != nullptr ? t->text : "unrecognized error code";
}

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* t = find_error(error);
  return t != nullptr ? t->name : "cudaErrorUnknown";
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
