// The CUDA runtime double: "device" memory (host memory the double owns, recorded
// with the device that was current at cudaMalloc, that host code cannot touch),
// copies and fills.
#include <cuda_runtime_api.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "../common/fork_safe.hpp"
#include "../gpu_double.hpp"
#include "state.hpp"

namespace gpu_double {
namespace {

constexpr size_t kAlignment = 256;  // cudaMalloc's documented minimum alignment

// Memory given back while work queued before was still pending: unmapped once every
// stream of its device passed the point it had reached then.
struct DeferredFree {
  Allocation a;
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> tails;
};

struct Allocations {
  std::mutex mu;
  std::map<uintptr_t, Allocation> by_base;
  std::vector<DeferredFree> deferred;
};
// Both mappings of `size` bytes of one memfd: {PROT_NONE address, readable alias}.
std::pair<void*, void*> map_pair(size_t size) {
  const int fd = memfd_create("gpu_double", MFD_CLOEXEC);
  if (fd < 0) return {nullptr, nullptr};
  void* alias = MAP_FAILED;
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
    alias = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    base = mmap(nullptr, size, PROT_NONE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (alias == MAP_FAILED || base == MAP_FAILED) {
    if (alias != MAP_FAILED) munmap(alias, size);
    if (base != MAP_FAILED) munmap(base, size);
    return {nullptr, nullptr};
  }
  return {base, alias};
}

void unmap(const Allocation& a) {
  munmap(reinterpret_cast<void*>(a.base), a.mapped);
  munmap(reinterpret_cast<void*>(a.alias), a.mapped);
}

// A forked child would share its parent's device memory (the mappings are shared):
// it gets a copy at the same addresses instead, as a fork of plain memory would.
// Memory whose free waited for queued work goes: that work never runs in the child
// (it has no stream threads), and its streams' locks may be held by parent threads.
void copy_for_child(Allocations& all) {
  for (auto& [base, a] : all.by_base) {
    auto [fresh_base, fresh_alias] = map_pair(a.mapped);
    if (fresh_base == nullptr) continue;
    std::memcpy(fresh_alias, reinterpret_cast<void*>(a.alias), a.mapped);
    mremap(fresh_alias, a.mapped, a.mapped, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(a.alias));
    mremap(fresh_base, a.mapped, a.mapped, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(a.base));
  }
  for (const DeferredFree& f : all.deferred) unmap(f.a);
  all.deferred.clear();
}

Allocations& allocations() { return ForkSafe<Allocations, &copy_for_child>::get(); }

// Whether [p, p + bytes) lies in device memory.
bool is_device(const void* p, size_t bytes) {
  Allocation a;
  return find_allocation(p, bytes, a);
}

// Checks the sides of a copy that `kind` says are device memory.
bool copy_args_ok(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return true;
  if (dst == nullptr || src == nullptr) return false;
  switch (kind) {
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      return true;
    case cudaMemcpyHostToDevice:
      return is_device(dst, bytes);
    case cudaMemcpyDeviceToHost:
      return is_device(src, bytes);
    case cudaMemcpyDeviceToDevice:
      return is_device(dst, bytes) && is_device(src, bytes);
  }
  return false;
}

}  // namespace

bool find_allocation(const void* p, size_t bytes, Allocation& out) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(allocations().mu);
  auto& m = allocations().by_base;
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return false;
  --it;
  const Allocation& a = it->second;
  const size_t need = bytes == 0 ? 1 : bytes;
  if (addr < a.base || addr - a.base > a.size || a.size - (addr - a.base) < need) return false;
  out = a;
  return true;
}

void* host_view(const void* p) {
  Allocation a;
  if (p == nullptr || !find_allocation(p, 0, a)) return const_cast<void*>(p);
  return reinterpret_cast<void*>(a.alias + (reinterpret_cast<uintptr_t>(p) - a.base));
}

// Registers `size` bytes of device memory on `device`; nullptr when out of memory.
void* allocate_device(size_t size, int device) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));  // a multiple of cudaMalloc's 256
  const size_t mapped = (std::max<size_t>(size, 1) + page - 1) / page * page;
  auto [base, alias] = map_pair(mapped);
  if (base == nullptr) return nullptr;
  const auto b = reinterpret_cast<uintptr_t>(base);
  std::lock_guard lock(allocations().mu);
  allocations().by_base[b] = Allocation{b, reinterpret_cast<uintptr_t>(alias), size, mapped, device};
  return base;
}

// Unregisters and frees device memory; false when `p` is not the base of an allocation.
bool free_device(void* p) {
  Allocation freed;
  {
    std::lock_guard lock(allocations().mu);
    auto& m = allocations().by_base;
    auto it = m.find(reinterpret_cast<uintptr_t>(p));
    if (it == m.end()) return false;
    freed = it->second;
    m.erase(it);
  }
  // Queued work may still use it (CUDA's cudaFree would wait for the device): free
  // it once that work passed, without blocking here. Work that never finishes (a
  // peer gone, no abort) keeps it: a leak, never a use after free.
  auto tails = device_tails(freed.device);
  std::vector<Allocation> ready;
  {
    std::lock_guard lock(allocations().mu);
    auto& d = allocations().deferred;
    d.push_back(DeferredFree{freed, std::move(tails)});
    std::erase_if(d, [&](const DeferredFree& f) {
      for (const auto& [stream, ticket] : f.tails)
        if (stream->completed() < ticket) return false;
      ready.push_back(f.a);
      return true;
    });
  }
  for (const Allocation& a : ready) unmap(a);
  return true;
}

}  // namespace gpu_double

using namespace gpu_double;

extern "C" {
// For the NCCL double's ncclMemAlloc/ncclMemFree.
__attribute__((visibility("default"))) void* gpu_double_alloc(size_t size, int device) {
  return allocate_device(size, device);
}
__attribute__((visibility("default"))) int gpu_double_free(void* p) { return free_device(p) ? 0 : -1; }
// The double's readable view of `p` (see host_view), for the NCCL double's tasks.
__attribute__((visibility("default"))) void* gpu_double_host_view(const void* p) { return host_view(p); }
// Reads or writes device memory from the host at once, outside every stream (tests).
__attribute__((visibility("default"))) int gpu_double_peek(void* dst, const void* device_src, size_t bytes) {
  if (bytes > 0 && !is_device(device_src, bytes)) return -1;
  std::memcpy(dst, host_view(device_src), bytes);
  return 0;
}
__attribute__((visibility("default"))) int gpu_double_poke(void* device_dst, const void* src, size_t bytes) {
  if (bytes > 0 && !is_device(device_dst, bytes)) return -1;
  std::memcpy(host_view(device_dst), src, bytes);
  return 0;
}
// How many freed allocations wait for queued work before they are unmapped.
__attribute__((visibility("default"))) int gpu_double_pending_frees() {
  std::lock_guard lock(allocations().mu);
  return static_cast<int>(allocations().deferred.size());
}
// The device of the allocation holding [p, p + bytes), or -1 when that is not device memory.
__attribute__((visibility("default"))) int gpu_double_device_of(const void* p, size_t bytes) {
  Allocation a;
  return p != nullptr && find_allocation(p, bytes, a) ? a.device : -1;
}
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  *ptr = nullptr;
  if (cudaError_t e = sticky_fail(current_device()); e != cudaSuccess) return e;
  if (size == 0) return cudaSuccess;
  *ptr = allocate_device(size, current_device());
  return *ptr != nullptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  // Unlike CUDA, the double does not synchronize the device here (see gpu_double.hpp).
  // After a kernel fault it answers the sticky error (and still lets the memory go).
  if (!free_device(ptr)) return fail(cudaErrorInvalidValue);
  return sticky_fail(current_device());
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = std::aligned_alloc(kAlignment, (size + kAlignment - 1) / kAlignment * kAlignment);
  return *ptr != nullptr || size == 0 ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (!copy_args_ok(dst, src, count, kind)) return fail(cudaErrorInvalidValue);
  auto s = resolve_stream(stream);
  if (cudaError_t e = sticky_fail(s->device()); e != cudaSuccess) return e;
  if (count > 0) {
    void* to = host_view(dst);
    const void* from = host_view(src);
    enqueue_ordered(s, [to, from, count] { std::memmove(to, from, count); });
  }
  return cudaSuccess;
}

// As CUDA: runs on the legacy stream. Device to device returns at once; a copy
// from or to host memory returns once done (see gpu_double.hpp).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (!copy_args_ok(dst, src, count, kind)) return fail(cudaErrorInvalidValue);
  auto s = legacy_stream(current_device());
  if (cudaError_t e = sticky_fail(s->device()); e != cudaSuccess) return e;
  if (count == 0) return cudaSuccess;
  void* to = host_view(dst);
  const void* from = host_view(src);
  const uint64_t ticket = enqueue_ordered(s, [to, from, count] { std::memmove(to, from, count); });
  if (is_device(dst, count) && is_device(src, count)) return cudaSuccess;
  s->wait_until(ticket);
  return sticky_fail(s->device());
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (count > 0 && !is_device(ptr, count)) return fail(cudaErrorInvalidValue);
  auto s = resolve_stream(stream);
  if (cudaError_t e = sticky_fail(s->device()); e != cudaSuccess) return e;
  if (count > 0) {
    void* to = host_view(ptr);
    enqueue_ordered(s, [to, value, count] { std::memset(to, value, count); });
  }
  return cudaSuccess;
}

// As CUDA for device memory: queued on the legacy stream, the host does not wait.
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  return cudaMemsetAsync(ptr, value, count, cudaStreamLegacy);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  *attributes = cudaPointerAttributes{};
  Allocation a;
  if (ptr != nullptr && find_allocation(ptr, 0, a)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = a.device;
    attributes->devicePointer = const_cast<void*>(ptr);
    attributes->hostPointer = nullptr;
  } else {
    // Plain host memory: CUDA 11+ answers cudaSuccess with type Unregistered; the
    // device it reports then is not documented (the double says -2).
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->devicePointer = nullptr;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}
