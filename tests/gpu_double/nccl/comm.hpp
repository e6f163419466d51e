// The NCCL double's communicator state, shared by the API (comm.cpp, calls.cpp) and
// the tasks that run its operations on a stream (ops.cpp).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shm_transport.hpp"

namespace gpu_double::nccl {

struct Core {
  std::string name;         // the segment's name
  int nranks = 0;
  int rank = 0;
  int device = 0;           // the device current at init (the parent's for a split)
  int fault_rank = 0;       // the rank faults match: the rank given at init (the root's)
  bool blocking = true;     // config.blocking (default 1)
  std::unique_ptr<Segment> segment;  // set once joined

  std::atomic<int> state{ncclInProgress};  // what ncclCommGetAsyncError reports
  std::atomic<bool> aborted{false};
  std::atomic<bool> stuck{false};          // enqueue_pending fired: in progress for good

  std::mutex mu;
  std::condition_variable idle;            // `running` dropped to 0
  int running = 0;                         // tasks executing now (abort waits for them)
  long calls = 0;                          // calls accepted (counts for the faults)
  bool finalized = false;                  // ncclCommFinalize was called
  bool launched = false;                   // a task was queued (the first answers ncclInProgress)
  uint64_t splits = 0;                     // splits issued on this communicator
  std::vector<std::thread> helpers;        // init/split threads, joined at teardown
  std::map<cudaStream_t, cudaEvent_t> last;  // per stream used, an event after its last task
  std::mutex launch_mu;                    // launches of this communicator, one at a time
  cudaEvent_t order = nullptr;             // after the last task: the next one waits for it
};

}  // namespace gpu_double::nccl

// The opaque handle of nccl.h, defined by the double.
struct ncclComm {
  std::shared_ptr<gpu_double::nccl::Core> core;
};

namespace gpu_double::nccl {

// One collective or point-to-point call, as recorded until its group is launched.
enum class Kind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Send, Recv };

struct Call {
  Kind kind = Kind::AllReduce;
  std::shared_ptr<Core> core;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;               // elements (per rank for all_gather/reduce_scatter)
  ncclDataType_t dtype = ncclInt8;
  ncclRedOp_t op = ncclSum;
  int peer = -1;                  // root, or the peer of send/recv
  cudaStream_t stream = nullptr;
  bool hang = false;              // async_error: never completes (until abort)
  bool fault = false;             // event_error: fails on its stream
};

// Runs one fused task of `calls` (all on `core`) until done or aborted.
void run_calls(Core& core, std::vector<Call>& calls);

// Records `text` as the process's last NCCL error (ncclGetLastError) and returns `r`.
ncclResult_t fail(ncclResult_t r, const std::string& text);
void trace(const Core* core, const std::string& what);

}  // namespace gpu_double::nccl
