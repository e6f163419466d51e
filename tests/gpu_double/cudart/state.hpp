// The CUDA runtime double's internal state: the calling thread's device and last
// error, streams (an in-order queue run by a thread of its own), events, and the
// registry of "device" allocations. See gpu_double.hpp for the semantics.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

// The opaque handles of cuda_runtime_api.h, defined by the double.
struct CUstream_st;
struct CUevent_st;

namespace gpu_double {

// Records `e` as the calling thread's last error (unless cudaSuccess) and returns it.
cudaError_t fail(cudaError_t e);
int current_device();
int device_count();
// The device's sticky error (cudaErrorLaunchFailure after a failed task), or cudaSuccess.
cudaError_t sticky_error(int device);
// As CUDA after a kernel fault: every call on the device answers the sticky error
// (recorded as the last error); cudaSuccess while there is none.
cudaError_t sticky_fail(int device);
void set_sticky_error(int device, cudaError_t e);

// ---------------------------------------------------------------------------------
// Stream: tasks run in order on a worker thread. A task is numbered by its ticket
// (1, 2, ...); completed() is the last finished ticket.
// ---------------------------------------------------------------------------------
class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(int device, bool blocking, bool legacy);
  int device() const { return device_; }
  bool blocking() const { return blocking_; }
  bool legacy() const { return legacy_; }

  // Queues `task` after `waits` (other streams' tickets) are reached; returns its
  // ticket. After a kernel fault on the device, `drop` runs instead of `task`.
  uint64_t enqueue(std::function<void()> task, std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> waits = {},
                   std::function<void()> drop = nullptr);
  uint64_t last_ticket();     // the ticket of the last queued task (0: none)
  uint64_t completed();
  void wait_until(uint64_t ticket);  // blocks until completed() >= ticket
  // Lets the worker finish the queue and exit; the Stream lives while anyone holds it.
  void retire();

 private:
  struct Task {
    std::function<void()> run;
    std::function<void()> drop;
    std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> waits;
  };
  void work(std::shared_ptr<Stream> self);

  const int device_;
  const bool blocking_;
  const bool legacy_;
  std::mutex mu_;
  std::condition_variable queued_;    // a task was queued or the stream retired
  std::condition_variable finished_;  // a task finished
  std::deque<Task> queue_;
  uint64_t issued_ = 0;
  uint64_t completed_ = 0;
  bool started_ = false;
  bool retired_ = false;
};

// The stream a handle names (0 / cudaStreamLegacy / cudaStreamPerThread: the current
// device's legacy stream); nullptr for a handle the double did not create.
std::shared_ptr<Stream> resolve_stream(cudaStream_t handle);
std::shared_ptr<Stream> legacy_stream(int device);

// Queues `task` on `stream` with the implicit synchronisation of the legacy stream:
// work on the legacy stream waits for every blocking stream of its device, and work
// on a blocking stream waits for the legacy stream.
uint64_t enqueue_ordered(const std::shared_ptr<Stream>& stream, std::function<void()> task,
                         std::function<void()> drop = nullptr);
// Every stream of `device` with the ticket of its last queued task.
std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> device_tails(int device);
// Blocks until every stream of `device` finished what was queued on it so far.
void synchronize_device(int device);

// ---------------------------------------------------------------------------------
// Device memory registry
// ---------------------------------------------------------------------------------
// The address handed out (`base`) is mapped PROT_NONE, so host code touching device
// memory faults as on a GPU; the double itself reads and writes the same pages
// through `alias`.
struct Allocation {
  uintptr_t base = 0;
  uintptr_t alias = 0;
  size_t size = 0;     // as asked for
  size_t mapped = 0;   // both mappings' length (whole pages)
  int device = -1;
};

// The allocation containing [p, p + bytes), if any (bytes 0: containing p).
bool find_allocation(const void* p, size_t bytes, Allocation& out);
// Where the double reads or writes `p`: the readable alias of device memory, `p` itself
// for anything else. Translated when work is queued, so a later cudaFree (whose
// release waits for that work) cannot make it dangle.
void* host_view(const void* p);

}  // namespace gpu_double
