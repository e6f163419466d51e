// The NCCL double: unique ids, forming, splitting, aborting and destroying
// communicators, and the queries. Calls are in calls.cpp.
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "../common/fork_safe.hpp"
#include "../common/knobs.hpp"
#include "../gpu_double.hpp"
#include "comm.hpp"


namespace gpu_double::nccl {
namespace {

// The last error's text: process-wide, as NCCL keeps it.
struct LastError {
  std::mutex mu;
  char text[1024] = "";
};
LastError& last_error() { return ForkSafe<LastError>::get(); }

bool is_blocking(const ncclConfig_t* config, bool inherited) {
  if (config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT) return inherited;
  return config->blocking != 0;
}

// Waits until every rank of `c` joined its segment (or `c`, or `also`, is aborted).
// Returns the communicator's settled state.
ncclResult_t join(Core& c, const Core* also = nullptr) {
  collect_stale_segments();
  auto opened = Segment::open(c.name, c.nranks);
  if (!opened) return fail(ncclSystemError, "shm_open/mmap of /" + c.name + " failed: " + std::strerror(errno));
  Segment& seg = *opened;
  {
    std::lock_guard lock(c.mu);  // teardown() reads it from another thread
    c.segment = std::move(opened);
  }
  Slot& mine = seg.slot(c.rank);
  mine.pid = static_cast<int32_t>(getpid());
  mine.device = c.device;
  mine.host = host_identity();
  mine.joined.store(1, std::memory_order_release);
  seg.ring_all();
  Waiter waiter(seg, c.rank);
  for (;;) {
    waiter.seen();
    if (c.aborted.load() || (also != nullptr && also->aborted.load())) return ncclInProgress;
    int joined = 0;
    for (int r = 0; r < c.nranks; ++r) joined += seg.slot(r).joined.load(std::memory_order_acquire) != 0;
    if (joined == c.nranks) break;
    waiter.idle();
  }
  // Every rank mapped it: the name is no longer needed.
  seg.unlink();
  for (int r = 0; r < c.nranks; ++r) {
    const Slot& s = seg.slot(r);
    if (r != c.rank && s.host == mine.host && s.device == mine.device)
      return fail(ncclInvalidUsage, "Duplicate GPU detected: rank " + std::to_string(c.rank) + " and rank " +
                                        std::to_string(r) + " both on device " + std::to_string(c.device));
  }
  return ncclSuccess;
}

// Runs `work` now (blocking communicator) or on a helper thread (non-blocking one),
// which settles `c.state`. Returns what the call answers.
template <typename Work>
ncclResult_t settle(const std::shared_ptr<Core>& c, bool blocking, Work work) {
  if (blocking) {
    const ncclResult_t r = work();
    c->state.store(r);
    return r;
  }
  std::lock_guard lock(c->mu);
  c->helpers.emplace_back([c, work] { c->state.store(work()); });
  return ncclInProgress;
}

// Ends every wait of `c`, waits for its running tasks, and frees what it holds.
void teardown(Core& c) {
  c.aborted.store(true);
  std::vector<std::thread> helpers;
  {
    std::unique_lock lock(c.mu);
    if (c.segment) c.segment->ring(c.rank);
    helpers.swap(c.helpers);
  }
  // A helper sees the flag at its next wake-up: at once when it waits on this
  // communicator's bell, within the sleep's bound when on a parent's.
  for (auto& t : helpers) t.join();
  {
    std::unique_lock lock(c.mu);
    c.idle.wait(lock, [&] { return c.running == 0; });
    for (auto& [stream, event] : c.last) cudaEventDestroy(event);
    c.last.clear();
  }
  {
    std::lock_guard lock(c.launch_mu);
    if (c.order != nullptr) cudaEventDestroy(c.order);
    c.order = nullptr;
  }
  if (c.segment) {
    c.segment->unlink();
  } else {
    shm_unlink(("/" + c.name).c_str());  // in case another rank created it
  }
}

// Waits until every operation queued on `c` so far finished, or `c` is aborted (the
// wait may sit behind other work on the stream that abort does not end). NCCL's flush
// waits for good when a peer never comes, as this does. It polls: the runtime has
// no wait that an abort could cut short.
void flush(Core& c) {
  std::vector<cudaEvent_t> events;
  {
    std::lock_guard lock(c.mu);
    for (auto& [stream, event] : c.last) events.push_back(event);
  }
  for (cudaEvent_t e : events)
    while (cudaEventQuery(e) == cudaErrorNotReady && !c.aborted.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

const char* result_text(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

}  // namespace

ncclResult_t fail(ncclResult_t r, const std::string& text) {
  if (r != ncclSuccess && r != ncclInProgress) {
    std::lock_guard lock(last_error().mu);
    std::snprintf(last_error().text, sizeof(last_error().text), "gpu double: %s", text.c_str());
  }
  return r;
}

void trace(const Core* core, const std::string& what) {
  if (!knobs().trace) return;
  if (core != nullptr) {
    std::fprintf(stderr, "gpu double: pid %d rank %d/%d dev %d: %s\n", static_cast<int>(getpid()), core->rank,
                 core->nranks, core->device, what.c_str());
  } else {
    std::fprintf(stderr, "gpu double: pid %d: %s\n", static_cast<int>(getpid()), what.c_str());
  }
}

}  // namespace gpu_double::nccl

using namespace gpu_double;
using namespace gpu_double::nccl;

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) { return result_text(result); }

const char* ncclGetLastError(ncclComm_t /*comm*/) { return last_error().text; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  trace(nullptr, "ncclGetUniqueId");
  if (id == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: id is null");
  if (find_process_fault("unique_id_error") != nullptr) return fail(ncclSystemError, "unique_id_error fault");
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, "gpudbl1", 8);
  size_t got = 0;
  while (got < 16) {
    const ssize_t n = getrandom(id->internal + 8 + got, 16 - got, 0);
    if (n <= 0) return fail(ncclSystemError, "getrandom failed");
    got += static_cast<size_t>(n);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommInitRankConfig: comm is null");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks));
  auto c = std::make_shared<Core>();
  c->name = segment_name(id.internal, sizeof(id.internal));
  c->nranks = nranks;
  c->rank = rank;
  c->fault_rank = rank;
  c->blocking = is_blocking(config, true);
  if (cudaGetDevice(&c->device) != cudaSuccess) return fail(ncclUnhandledCudaError, "cudaGetDevice failed");
  trace(c.get(), std::string("ncclCommInitRankConfig") + (c->blocking ? "" : " (non-blocking)"));
  if (find_fault("init_hang", rank) != nullptr) {
    *comm = new ncclComm{c};
    return ncclInProgress;  // never settles; even a blocking init answers (it cannot be aborted otherwise)
  }
  if (find_fault("init_error", rank) != nullptr) {
    if (c->blocking) return fail(ncclSystemError, "init_error fault");
    c->state.store(ncclSystemError);
    *comm = new ncclComm{c};
    return ncclInProgress;
  }
  const ncclResult_t r = settle(c, c->blocking, [c] { return join(*c); });
  if (r != ncclSuccess && r != ncclInProgress) {
    teardown(*c);
    return r;
  }
  *comm = new ncclComm{c};
  return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

// As NCCL 2.28 does: the call answers ncclSuccess even for a non-blocking
// communicator; *newcomm stays null until the split completed, the parent reports
// ncclInProgress until then, and the child is written to *newcomm (from the
// background) before the parent reports the outcome.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (comm == nullptr || newcomm == nullptr) return fail(ncclInvalidArgument, "ncclCommSplit: null argument");
  *newcomm = nullptr;
  auto parent = comm->core;
  // As NCCL's ncclCommEnsureReady: still forming or splitting is ncclInvalidArgument,
  // a failed communicator answers its error.
  if (const int state = parent->state.load(); state != ncclSuccess)
    return fail(state == ncclInProgress ? ncclInvalidArgument : static_cast<ncclResult_t>(state),
                "ncclCommSplit: communicator not ready");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return fail(ncclInvalidArgument, "ncclCommSplit: negative color");
  trace(parent.get(), "ncclCommSplit color " + std::to_string(color) + " key " + std::to_string(key));
  const uint64_t generation = ++parent->splits;
  const bool blocking = is_blocking(config, parent->blocking);
  if (find_fault("split_hang", parent->fault_rank) != nullptr) {
    parent->state.store(ncclInProgress);
    return parent->blocking ? ncclInProgress : ncclSuccess;
  }
  if (find_fault("split_error", parent->fault_rank) != nullptr) {
    if (parent->blocking) return fail(ncclSystemError, "split_error fault");
    parent->state.store(ncclSystemError);
    return ncclSuccess;
  }
  std::shared_ptr<Core> child;
  if (color != NCCL_SPLIT_NOCOLOR) {
    child = std::make_shared<Core>();
    child->name = parent->name + "_s" + std::to_string(generation) + "_c" + std::to_string(color);
    child->device = parent->device;
    child->fault_rank = parent->fault_rank;
    child->blocking = blocking;
  }
  // The exchange of (color, key) through the parent's segment, then the child's join.
  auto work = [parent, child, color, key, generation, newcomm]() -> ncclResult_t {
    Segment& seg = *parent->segment;
    SplitProposal& mine = seg.slot(parent->rank).split[generation % 2];
    mine.color = color;
    mine.key = key;
    mine.generation.store(generation, std::memory_order_release);
    seg.ring_all();
    Waiter waiter(seg, parent->rank);
    for (;;) {
      waiter.seen();
      if (parent->aborted.load()) return ncclInProgress;
      int ready = 0;
      for (int r = 0; r < parent->nranks; ++r)
        ready += seg.slot(r).split[generation % 2].generation.load(std::memory_order_acquire) == generation;
      if (ready == parent->nranks) break;
      waiter.idle();
    }
    if (!child) return ncclSuccess;
    std::vector<std::pair<int, int>> members;  // (key, parent rank) of my color
    for (int r = 0; r < parent->nranks; ++r) {
      const SplitProposal& p = seg.slot(r).split[generation % 2];
      if (p.color == color) members.emplace_back(p.key, r);
    }
    std::sort(members.begin(), members.end());
    child->nranks = static_cast<int>(members.size());
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].second == parent->rank) child->rank = static_cast<int>(i);
    const ncclResult_t r = join(*child, parent.get());
    child->state.store(r);
    if (r != ncclSuccess) {
      teardown(*child);
      return r;
    }
    __atomic_store_n(newcomm, new ncclComm{child}, __ATOMIC_RELEASE);
    return ncclSuccess;
  };
  if (parent->blocking) return work();
  parent->state.store(ncclInProgress);
  std::lock_guard lock(parent->mu);
  parent->helpers.emplace_back([parent, work] { parent->state.store(work()); });
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (comm == nullptr || error == nullptr) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  *error = comm->core->stuck.load() ? ncclInProgress : static_cast<ncclResult_t>(comm->core->state.load());
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  trace(comm->core.get(), "ncclCommAbort");
  teardown(*comm->core);
  delete comm;
  return ncclSuccess;
}

// As NCCL: a non-blocking communicator answers ncclInProgress and reports the flush
// through ncclCommGetAsyncError; finalizing twice is ncclInvalidArgument.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is null");
  auto core = comm->core;
  trace(core.get(), "ncclCommFinalize");
  if (core->state.load() != ncclSuccess) return fail(ncclInvalidUsage, "ncclCommFinalize: communicator not ready");
  {
    std::lock_guard lock(core->mu);
    if (core->finalized) return fail(ncclInvalidArgument, "ncclCommFinalize: called twice");
    core->finalized = true;
  }
  if (core->blocking) {
    flush(*core);
    return ncclSuccess;
  }
  core->state.store(ncclInProgress);
  std::lock_guard lock(core->mu);
  core->helpers.emplace_back([core] {
    flush(*core);
    int expected = ncclInProgress;
    core->state.compare_exchange_strong(expected, ncclSuccess);
  });
  return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  trace(comm->core.get(), "ncclCommDestroy");
  // Queued operations finish first (a non-blocking finalize still flushing is cut
  // short: destroy it once finalize settled).
  if (comm->core->state.load() == ncclSuccess) flush(*comm->core);
  teardown(*comm->core);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: null argument");
  *count = comm->core->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: null argument");
  *rank = comm->core->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return fail(ncclInvalidArgument, "ncclCommCuDevice: null argument");
  *device = comm->core->device;
  return ncclSuccess;
}

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is null");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return fail(ncclUnhandledCudaError, "cudaGetDevice failed");
  *ptr = gpu_double_alloc(size, device);
  return *ptr != nullptr ? ncclSuccess : fail(ncclSystemError, "ncclMemAlloc: out of memory");
}

ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  return gpu_double_free(ptr) == 0 ? ncclSuccess : fail(ncclInvalidArgument, "ncclMemFree: not from ncclMemAlloc");
}
