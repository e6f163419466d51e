// The NCCL backend's communicator: forming it, enqueueing on it with a timeout,
// and breaking it (see communicator.hpp).
//
// Terms used below:
//  - communicator: the ncclComm_t. It is created non-blocking (ncclConfig_t::blocking
//    = 0) so that forming and splitting it can be bounded by a timeout: NCCL answers
//    ncclInProgress and we poll ncclCommGetAsyncError until it settles.
//  - stream: a CUDA stream of the group. Every operation is enqueued on it, after
//    the work the caller queued on the legacy default stream, and is followed by a
//    completion event.
//  - completion event: a CUDA event recorded after the operation; the Work polls it.
//    Events are pooled per communicator, so the hot path creates none.
//  - broken: after a timeout, an asynchronous NCCL error, the death of a peer process
//    on this host (PeerWatch: its pidfd fires; the error names it), a call NCCL
//    refuses (InvalidArgument: NCCL keeps refusing every later call) or abort() the
//    communicator is aborted (ncclCommAbort) and every pending and later operation
//    fails with the first error, as the ProcessGroup contract asks. A peer on another
//    host that dies is seen by NCCL's own transport (an asynchronous error) or, at
//    worst, by the operation's timeout.
#include "communicator.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <thread>

#include "ddp/types.hpp"

namespace ddp::nccl {

Clock::time_point deadline_after(Millis timeout) {
  auto now = Clock::now();
  // Millis::max() would overflow the clock's representation.
  if (timeout >= std::chrono::duration_cast<Millis>(Clock::time_point::max() - now)) return Clock::time_point::max();
  return now + timeout;
}

std::string ms_text(Millis t) { return std::to_string(t.count()) + " ms"; }

// "unhandled system error (run with NCCL_DEBUG=INFO for details): <last error>"
std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(": ") + last;
  return text;
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error("NCCL backend: " + what + ": " + cudaGetErrorString(e));
}

namespace {

// CUDA's errors that leave the process unusable: every later CUDA call answers them
// (driver_types.h: "any further CUDA work will return the same error").
bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorExternalDevice:
      return true;
    default:
      return false;
  }
}

// A CUDA error met by `call`: seen by its completion event ("NCCL all_reduce #2 of group
// 0: CUDA error: unspecified launch failure"), or while launching it, where a sticky one
// comes from work already on the device, this call's own kernels included ("CUDA error
// (sticky: from work on device 0 up to this call) while launching NCCL all_reduce #3 of
// group 0: unspecified launch failure").
std::string cuda_error_text(cudaError_t e, const CallId& call, int device, bool launching) {
  if (!launching) return "NCCL " + call.label() + ": CUDA error: " + cudaGetErrorString(e);
  const std::string origin =
      is_sticky(e) ? " (sticky: from work on device " + std::to_string(device) + " up to this call)" : "";
  return "CUDA error" + origin + " while launching NCCL " + call.label() + ": " + cudaGetErrorString(e);
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// A CUDA event cannot be waited on with a timeout (cudaEventSynchronize blocks for
// good) and a non-blocking NCCL call signals nothing, so both are polled: yield a few
// times (short collectives finish within microseconds), then sleep in growing steps
// up to 1 ms so that a long wait costs little CPU.
class Backoff {
 public:
  void pause() {
    if (spins_ < 64) {
      ++spins_;
      std::this_thread::yield();
      return;
    }
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
    std::this_thread::sleep_for(sleep_);
  }

 private:
  int spins_ = 0;
  std::chrono::microseconds sleep_{8};
};

// Makes `device` current for a scope and restores the caller's device: the caller
// may drive another GPU, and NCCL and event calls must run on the communicator's.
// `quiet` (destructors, abort paths) ignores a failure instead of throwing.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, bool quiet = false) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ == device_) return;
    cudaError_t e = cudaSetDevice(device_);
    if (!quiet) check_cuda(e, "cudaSetDevice(" + std::to_string(device_) + ")");
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// Polls `comm` while a non-blocking call is in progress. Returns the settled result,
// or ncclInProgress when `deadline` passed or `give_up()` said so first.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline, const std::function<bool()>& give_up) {
  Backoff backoff;
  while (r == ncclInProgress) {
    if (Clock::now() >= deadline || give_up()) return ncclInProgress;
    backoff.pause();
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

// Caller errors NCCL reports itself (a bad count, root or pointer). On a non-blocking
// communicator NCCL records them as its asynchronous error and refuses every later call
// (seen with NCCL 2.28), so they break the communicator like any other failure.
bool is_usage_error(ncclResult_t r) { return r == ncclInvalidArgument || r == ncclInvalidUsage; }

// ---------------------------------------------------------------------------------
// NcclWork: completes when its event fires; fails on the communicator's error or
// when the operation's own deadline passes (which aborts the communicator).
// ---------------------------------------------------------------------------------
class NcclWork final : public Work::State {
 public:
  NcclWork(std::shared_ptr<Communicator> comm, uint64_t ticket, cudaEvent_t event, Clock::time_point deadline,
           CallId call, Millis timeout)
      : comm_(std::move(comm)), ticket_(ticket), event_(event), deadline_(deadline), call_(std::move(call)),
        timeout_(timeout) {}
  ~NcclWork() override {
    bool seen_done = false;
    {
      std::lock_guard lock(mu);
      seen_done = done;
    }
    if (!seen_done && recorder_owner) {
      comm_->orphan(ticket_, event_, std::move(recorder_owner), record);
    } else {
      comm_->give_event(event_);
    }
  }

  bool finished() override { return poll(); }

  bool wait_for(Millis timeout) override {
    auto until = deadline_after(timeout);
    Backoff backoff;
    while (!poll()) {
      if (Clock::now() >= until) return false;
      backoff.pause();
    }
    return true;
  }

 private:
  // One look at the operation; true once it is complete (with or without an error).
  bool poll() {
    {
      std::lock_guard lock(mu);
      if (done) return true;
    }
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaSuccess) {
      comm_->close_orphans(ticket_);  // those issued before this one ended too
      // ncclCommAbort ends the kernels early, which fires the event too: an operation
      // seen finishing after the communicator broke is not trusted.
      complete(comm_->broken());
      return true;
    }
    if (e != cudaErrorNotReady) {
      comm_->fail(std::make_exception_ptr(Error(cuda_error_text(e, call_, comm_->device(), false))));
      complete(comm_->broken());
      return true;
    }
    if (auto error = comm_->check(call_)) {
      complete(error);
      return true;
    }
    if (Clock::now() >= deadline_) {
      comm_->fail(std::make_exception_ptr(Timeout("NCCL " + call_.label() + " did not finish within " + ms_text(timeout_) +
                                                  " (a peer is stuck or gone); the communicator was aborted")));
      complete(comm_->broken());
      return true;
    }
    return false;
  }

  std::shared_ptr<Communicator> comm_;
  uint64_t ticket_;                  // the operation's number on comm_ (launch order)
  cudaEvent_t event_;                // recorded after the operation on the group's stream
  Clock::time_point deadline_;       // the operation's timeout, from when it was issued
  CallId call_;                      // for messages, and whose peers it waits on
  Millis timeout_;
};

}  // namespace

// ---------------------------------------------------------------------------------
// Communicator
// ---------------------------------------------------------------------------------
Communicator::Communicator(ncclComm_t comm, int device, Millis timeout,
                           std::shared_ptr<const detail::PeerWatch> watch)
    : comm_(comm), device_(device), timeout_(timeout), watch_(std::move(watch)) {
  try {
    DeviceGuard guard(device_);
    // Non-blocking stream: later work on the default stream must not wait for our
    // collectives (that would undo any overlap); launch() orders us after it instead.
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaMalloc(&scratch_, sizeof(int32_t)), "cudaMalloc");
    check_cuda(cudaMemset(scratch_, 0, sizeof(int32_t)), "cudaMemset");
  } catch (...) {
    release();
    throw;
  }
}

Communicator::~Communicator() {
  DeviceGuard guard(device_, /*quiet=*/true);
  // Let operations still queued (async ones nobody waited for) finish, within the
  // group's timeout, rather than cutting them off; but not wait for a peer that is
  // gone or a communicator NCCL reports failed (check() aborts it then).
  if (stream_ != nullptr && !stop_.load()) {
    auto deadline = deadline_after(timeout_);
    Backoff backoff;
    const CallId ending{"the group's end", 0, "", -1};
    while (cudaStreamQuery(stream_) == cudaErrorNotReady && Clock::now() < deadline && !check(ending)) {
      backoff.pause();
    }
  }
  close_orphans();
  for (Orphan& o : orphans_) {  // never ended: failed
    o.recorder->ended(o.record, false);
    free_events_.push_back(o.event);
  }
  orphans_.clear();
  release();
}

std::string CallId::label() const {
  std::string out = what;
  if (seq > 0) out += " #" + std::to_string(seq);
  if (!group.empty()) out += " of group " + group;
  return out;
}

std::exception_ptr Communicator::check(const CallId& during) {
  if (auto e = broken()) return e;
  if (const int dead = watch_->dead_peer(during.peer); dead >= 0) {
    fail(std::make_exception_ptr(PeerError(dead, "NCCL: " + watch_->how_gone(dead) + " in " + during.label() +
                                                     "; the communicator was aborted")));
    return broken();
  }
  ncclResult_t state = ncclSuccess;
  std::string text;
  {
    std::lock_guard lock(mu_);
    if (comm_ == nullptr) return broken();
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    if (state == ncclSuccess || state == ncclInProgress) return nullptr;
    text = nccl_text(state, comm_);
  }
  fail(std::make_exception_ptr(Error("NCCL communicator failed: " + text)));
  return broken();
}

void Communicator::fail(std::exception_ptr reason) {
  {
    std::lock_guard lock(broken_mu_);
    if (!broken_) broken_ = std::move(reason);
  }
  stop_.store(true);  // a launch() polling NCCL under mu_ gives up and releases it
  std::lock_guard lock(mu_);
  if (comm_ != nullptr) {
    DeviceGuard guard(device_, /*quiet=*/true);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

std::exception_ptr Communicator::broken() {
  std::lock_guard lock(broken_mu_);
  return broken_;
}

cudaEvent_t Communicator::take_event(const std::function<void(cudaError_t)>& check) {
  {
    std::lock_guard lock(events_mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  DeviceGuard guard(device_);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void Communicator::give_event(cudaEvent_t e) {
  std::lock_guard lock(events_mu_);
  free_events_.push_back(e);
}

void Communicator::orphan(uint64_t ticket, cudaEvent_t e, std::shared_ptr<detail::FlightRecorder> recorder,
                          uint64_t record) {
  {
    std::lock_guard lock(events_mu_);
    // Works may be dropped in any order; keep the orphans in launch order.
    auto at = orphans_.end();
    while (at != orphans_.begin() && std::prev(at)->ticket > ticket) --at;
    orphans_.insert(at, Orphan{ticket, e, std::move(recorder), record});
  }
  close_orphans();
}

void Communicator::close_orphans(uint64_t done_through) {
  std::lock_guard lock(events_mu_);
  while (!orphans_.empty()) {
    Orphan& o = orphans_.front();
    if (o.ticket > done_through && cudaEventQuery(o.event) == cudaErrorNotReady) break;
    // As NcclWork::poll: an operation seen ending after the communicator broke failed.
    o.recorder->ended(o.record, broken() == nullptr);
    free_events_.push_back(o.event);
    orphans_.pop_front();
  }
}

// Frees what exists; aborting rather than ncclCommDestroy never waits for peers
// (which may have exited already) at shutdown.
void Communicator::release() {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  free_events_.clear();
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (scratch_ != nullptr) cudaFree(scratch_);
}

std::shared_ptr<Work::State> Communicator::launch_erased(CallId call, Millis timeout, void* enqueue, EnqueueFn fn) {
  if (auto e = broken()) std::rethrow_exception(e);
  auto deadline = deadline_after(timeout);
  cudaEvent_t event = nullptr;
  uint64_t ticket = 0;
  std::exception_ptr error;
  {
    std::lock_guard lock(mu_);
    try {
      if (comm_ == nullptr) {
        error = broken();
      } else {
        DeviceGuard guard(device_);
        // A kernel fault is sticky: CUDA answers it from the next call, often one of
        // these, so the error names the call being launched and breaks the communicator.
        auto cuda = [&](cudaError_t e) {
          if (e != cudaSuccess) throw Error(cuda_error_text(e, call, device_, true));
        };
        event = take_event(cuda);
        // Plain kernel launches and cudaMemcpy go to the legacy default stream: run
        // after what the caller queued there, without making its later work wait for us.
        cuda(cudaEventRecord(ready_, cudaStreamLegacy));
        cuda(cudaStreamWaitEvent(stream_, ready_, 0));
        ncclResult_t r = settle(comm_, fn(enqueue, comm_, stream_), deadline, [this] { return stop_.load(); });
        if (r == ncclSuccess) {
          cuda(cudaEventRecord(event, stream_));
          ticket = ++launched_;
        } else if (r == ncclInProgress) {
          error = stop_.load() ? broken()
                               : std::make_exception_ptr(Timeout("NCCL " + call.label() + " could not be enqueued within " +
                                                                 ms_text(timeout) + "; the communicator was aborted"));
        } else if (is_usage_error(r)) {
          error = std::make_exception_ptr(InvalidArgument(
              "NCCL " + call.label() + " was refused: " + nccl_text(r, comm_) +
              "; NCCL refuses every later call on this communicator, so the group can no longer be used"));
        } else {
          error = std::make_exception_ptr(Error("NCCL " + call.label() + " failed: " + nccl_text(r, comm_)));
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    if (event != nullptr) give_event(event);
    fail(error);
    std::rethrow_exception(broken());
  }
  return std::make_shared<NcclWork>(shared_from_this(), ticket, event, deadline, std::move(call), timeout);
}

ncclComm_t Communicator::split(int color, int key, Millis timeout, const detail::PeerWatch& waits_on) {
  if (auto e = broken()) std::rethrow_exception(e);
  auto deadline = deadline_after(timeout);
  ncclComm_t child = nullptr;
  std::exception_ptr error;
  {
    std::lock_guard lock(mu_);
    if (comm_ == nullptr) std::rethrow_exception(broken());
    DeviceGuard guard(device_);
    ncclConfig_t config = nonblocking_config();
    ncclResult_t r = ncclCommSplit(comm_, color, key, &child, &config);
    int dead = -1;
    auto give_up = [&] { return stop_.load() || (dead = waits_on.dead_peer(-1)) >= 0; };
    // The new communicator reports the split's progress; a rank left out has none, so
    // it watches the parent (which must be quiet again before its next call anyway).
    if (child != nullptr) r = settle(child, r, deadline, give_up);
    if (r == ncclSuccess || r == ncclInProgress) {
      ncclResult_t parent = ncclInProgress;
      if (ncclCommGetAsyncError(comm_, &parent) != ncclSuccess) parent = ncclInternalError;
      parent = settle(comm_, parent, deadline, give_up);
      if (r == ncclSuccess) r = parent;
    }
    if (r == ncclInProgress && dead >= 0) {
      if (child != nullptr) ncclCommAbort(child);
      child = nullptr;
      error = std::make_exception_ptr(PeerError(
          dead, "NCCL new_group: " + waits_on.how_gone(dead) + " in ncclCommSplit; the communicator was aborted"));
    } else if (r != ncclSuccess) {
      std::string text = r == ncclInProgress ? "did not finish within " + ms_text(timeout)
                                              : "failed: " + nccl_text(r, child != nullptr ? child : comm_);
      if (child != nullptr) ncclCommAbort(child);
      child = nullptr;
      if (r == ncclInProgress) {
        error = std::make_exception_ptr(Timeout("NCCL new_group: ncclCommSplit " + text));
      } else {
        error = std::make_exception_ptr(Error("NCCL new_group: ncclCommSplit " + text));
      }
    }
  }
  if (error) {
    // The ranks now disagree about the parent's state: it is broken like after a timeout.
    fail(error);
    std::rethrow_exception(broken());
  }
  return child;
}

// Rank 0's id is already known to all; forms the communicator within `timeout`.
ncclComm_t init_communicator(const std::string& id_bytes, int size, int rank, Millis timeout,
                             const detail::PeerWatch& watch) {
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  auto deadline = deadline_after(timeout);
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  int dead = -1;
  if (comm != nullptr) r = settle(comm, r, deadline, [&] { return (dead = watch.dead_peer(-1)) >= 0; });
  if (r == ncclSuccess) return comm;
  if (r == ncclInProgress && dead >= 0) {
    ncclCommAbort(comm);
    throw PeerError(dead, "NCCL init: " + watch.how_gone(dead) + " while forming the communicator");
  }
  std::string text = r == ncclInProgress ? "rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                               ": not every rank joined within " + ms_text(timeout)
                                         : nccl_text(r, comm);
  if (comm != nullptr) ncclCommAbort(comm);
  if (r == ncclInProgress) throw Timeout("NCCL init: " + text);
  throw Error("NCCL init (ncclCommInitRankConfig) failed: " + text);
}

}  // namespace ddp::nccl
