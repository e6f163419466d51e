// The NCCL backend: one NCCL communicator per group, on the GPU numbered local_rank.
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
//    on this host (PeerWatch: its pidfd fires; the error names it) or abort() the
//    communicator is aborted (ncclCommAbort) and every pending and later operation
//    fails with the first error, as the ProcessGroup contract asks. A peer on another
//    host that dies is seen by NCCL's own transport (an asynchronous error) or, at
//    worst, by the operation's timeout.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/contract/store_keys.hpp"
#include "backend.hpp"
#include "peer_watch.hpp"
#include "work_state.hpp"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;


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

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  throw InvalidArgument("NCCL backend: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // integer types: sum then truncating division
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Prod: return ncclProd;
  }
  throw InvalidArgument("NCCL backend: unknown reduce op");
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
// or ncclInProgress when `deadline` passed or `stop` was raised first.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline, const std::atomic<bool>* stop) {
  Backoff backoff;
  while (r == ncclInProgress) {
    if (Clock::now() >= deadline || (stop != nullptr && stop->load())) return ncclInProgress;
    backoff.pause();
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

// Caller errors NCCL reports itself (a bad count or root): the communicator stays usable.
bool is_usage_error(ncclResult_t r) { return r == ncclInvalidArgument || r == ncclInvalidUsage; }

// ---------------------------------------------------------------------------------
// Communicator: the ncclComm_t with its stream, event pool and broken state. The
// group and every Work it returned hold it, so it lives while operations are pending.
// ---------------------------------------------------------------------------------
class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // Takes ownership of `comm` (formed on `device`); `timeout` bounds the drain at
  // destruction; `watch` tells when a peer on this host died.
  Communicator(ncclComm_t comm, int device, Millis timeout, std::shared_ptr<const PeerWatch> watch)
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

  ~Communicator() {
    DeviceGuard guard(device_, /*quiet=*/true);
    // Let operations still queued (async ones nobody waited for) finish, within the
    // group's timeout, rather than cutting them off.
    if (stream_ != nullptr && !stop_.load()) {
      auto deadline = deadline_after(timeout_);
      Backoff backoff;
      while (cudaStreamQuery(stream_) == cudaErrorNotReady && Clock::now() < deadline) backoff.pause();
    }
    release();
  }

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int device() const { return device_; }
  const std::shared_ptr<const PeerWatch>& watch() const { return watch_; }
  int32_t* scratch() const { return scratch_; }

  // Enqueues one operation: `enqueue(comm, stream)` issues its NCCL calls. Returns the
  // Work state that completes with it. Throws the error the communicator broke with.
  template <typename Enqueue>
  std::shared_ptr<Work::State> launch(const std::string& what, Millis timeout, Enqueue&& enqueue);

  // Splits this communicator (collective over all its ranks). Returns the new
  // communicator, or nullptr for color NCCL_SPLIT_NOCOLOR.
  ncclComm_t split(int color, int key, Millis timeout);

  // The error this communicator broke with, after checking the local peers and NCCL's
  // asynchronous error state (either breaks it). nullptr while healthy.
  std::exception_ptr check() {
    if (auto e = broken()) return e;
    if (const int dead = watch_->dead_peer(); dead >= 0) {
      fail(std::make_exception_ptr(PeerError(dead, "NCCL: peer " + watch_->describe(dead) +
                                                       " exited; the communicator was aborted")));
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

  // Breaks the communicator with `reason` (the first reason is kept) and aborts it.
  void fail(std::exception_ptr reason) {
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

  std::exception_ptr broken() {
    std::lock_guard lock(broken_mu_);
    return broken_;
  }

  cudaEvent_t take_event() {
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
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }

  void give_event(cudaEvent_t e) {
    std::lock_guard lock(events_mu_);
    free_events_.push_back(e);
  }

 private:
  // Frees what exists; aborting rather than ncclCommDestroy never waits for peers
  // (which may have exited already) at shutdown.
  void release() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    free_events_.clear();
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  std::mutex mu_;                   // serialises every NCCL call on comm_ (not thread-safe)
  ncclComm_t comm_ = nullptr;       // nullptr once aborted
  const int device_;                // the GPU the communicator was formed on
  const Millis timeout_;            // bounds the drain in the destructor
  const std::shared_ptr<const PeerWatch> watch_;  // this host's peers, by pidfd
  cudaStream_t stream_ = nullptr;   // every operation runs here, in issue order
  cudaEvent_t ready_ = nullptr;     // orders each operation after the default stream's work
  int32_t* scratch_ = nullptr;      // one device int for barrier()
  std::atomic<bool> stop_{false};   // raised by fail()

  std::mutex broken_mu_;
  std::exception_ptr broken_;       // the first error; set once

  std::mutex events_mu_;
  std::vector<cudaEvent_t> free_events_;  // completion events ready for reuse
};

// ---------------------------------------------------------------------------------
// NcclWork: completes when its event fires; fails on the communicator's error or
// when the operation's own deadline passes (which aborts the communicator).
// ---------------------------------------------------------------------------------
class NcclWork final : public Work::State {
 public:
  NcclWork(std::shared_ptr<Communicator> comm, cudaEvent_t event, Clock::time_point deadline, std::string what,
           Millis timeout)
      : comm_(std::move(comm)), event_(event), deadline_(deadline), what_(std::move(what)), timeout_(timeout) {}
  ~NcclWork() override { comm_->give_event(event_); }

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
      // ncclCommAbort ends the kernels early, which fires the event too: an operation
      // seen finishing after the communicator broke is not trusted.
      complete(comm_->broken());
      return true;
    }
    if (e != cudaErrorNotReady) {
      comm_->fail(std::make_exception_ptr(Error("NCCL " + what_ + ": CUDA error: " + cudaGetErrorString(e))));
      complete(comm_->broken());
      return true;
    }
    if (auto error = comm_->check()) {
      complete(error);
      return true;
    }
    if (Clock::now() >= deadline_) {
      comm_->fail(std::make_exception_ptr(Timeout("NCCL " + what_ + " did not finish within " + ms_text(timeout_) +
                                                  " (a peer is stuck or gone); the communicator was aborted")));
      complete(comm_->broken());
      return true;
    }
    return false;
  }

  std::shared_ptr<Communicator> comm_;
  cudaEvent_t event_;                // recorded after the operation on the group's stream
  Clock::time_point deadline_;       // the operation's timeout, from when it was issued
  std::string what_;                 // "all_reduce", for messages
  Millis timeout_;
};

template <typename Enqueue>
std::shared_ptr<Work::State> Communicator::launch(const std::string& what, Millis timeout, Enqueue&& enqueue) {
  if (auto e = broken()) std::rethrow_exception(e);
  auto deadline = deadline_after(timeout);
  cudaEvent_t event = take_event();
  std::exception_ptr error;
  bool breaks = true;  // whether `error` breaks the communicator
  {
    std::lock_guard lock(mu_);
    try {
      if (comm_ == nullptr) {
        error = broken();
      } else {
        DeviceGuard guard(device_);
        // Plain kernel launches and cudaMemcpy go to the legacy default stream: run
        // after what the caller queued there, without making its later work wait for us.
        check_cuda(cudaEventRecord(ready_, cudaStreamLegacy), "cudaEventRecord");
        check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
        ncclResult_t r = settle(comm_, enqueue(comm_, stream_), deadline, &stop_);
        if (r == ncclSuccess) {
          check_cuda(cudaEventRecord(event, stream_), "cudaEventRecord");
        } else if (r == ncclInProgress) {
          error = stop_.load() ? broken()
                               : std::make_exception_ptr(Timeout("NCCL " + what + " could not be enqueued within " +
                                                                 ms_text(timeout) + "; the communicator was aborted"));
        } else if (is_usage_error(r)) {
          breaks = false;
          error = std::make_exception_ptr(InvalidArgument("NCCL " + what + ": " + nccl_text(r, comm_)));
        } else {
          error = std::make_exception_ptr(Error("NCCL " + what + " failed: " + nccl_text(r, comm_)));
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    give_event(event);
    if (!breaks) std::rethrow_exception(error);
    fail(error);
    std::rethrow_exception(broken());
  }
  return std::make_shared<NcclWork>(shared_from_this(), event, deadline, what, timeout);
}

ncclComm_t Communicator::split(int color, int key, Millis timeout) {
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
    // The new communicator reports the split's progress; a rank left out has none, so
    // it watches the parent (which must be quiet again before its next call anyway).
    if (child != nullptr) r = settle(child, r, deadline, &stop_);
    if (r == ncclSuccess || r == ncclInProgress) {
      ncclResult_t parent = ncclInProgress;
      if (ncclCommGetAsyncError(comm_, &parent) != ncclSuccess) parent = ncclInternalError;
      parent = settle(comm_, parent, deadline, &stop_);
      if (r == ncclSuccess) r = parent;
    }
    if (r != ncclSuccess) {
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
ncclComm_t init_communicator(const std::string& id_bytes, int size, int rank, Millis timeout) {
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  auto deadline = deadline_after(timeout);
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (comm != nullptr) r = settle(comm, r, deadline, nullptr);
  if (r == ncclSuccess) return comm;
  std::string text = r == ncclInProgress ? "rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                               ": not every rank joined within " + ms_text(timeout)
                                         : nccl_text(r, comm);
  if (comm != nullptr) ncclCommAbort(comm);
  if (r == ncclInProgress) throw Timeout("NCCL init: " + text);
  throw Error("NCCL init (ncclCommInitRankConfig) failed: " + text);
}

// ---------------------------------------------------------------------------------
// The process group.
// ---------------------------------------------------------------------------------

// ncclGroupStart/End around `body`, ending the group even when body failed.
template <typename Body>
ncclResult_t grouped(Body&& body) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  ncclResult_t first = body();
  ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(int rank, int size, std::shared_ptr<Communicator> comm, Millis timeout, Millis connect_timeout)
      : ProcessGroup(rank, size, Reach::Gpu), comm_(std::move(comm)), timeout_(timeout),
        connect_timeout_(connect_timeout) {}

  std::string backend() const override { return "nccl"; }

  void abort(const std::string& reason) override {
    comm_->fail(std::make_exception_ptr(Error("process group aborted: " + reason)));
  }

 protected:
  Work run(const Op& op) override {
    const CollectiveOptions& o = op.options;
    switch (op.kind) {
      case OpKind::AllReduce: return all_reduce_on_gpu(op.input, op.reduce, o);
      case OpKind::Broadcast: return broadcast_on_gpu(op.input, op.peer, o);
      case OpKind::Reduce: return reduce_on_gpu(op.input, op.peer, op.reduce, o);
      case OpKind::AllGather: return all_gather_on_gpu(op.input, op.output, o);
      case OpKind::Gather: return gather_on_gpu(op.input, op.output, op.peer, o);
      case OpKind::Scatter: return scatter_on_gpu(op.input, op.output, op.peer, o);
      case OpKind::ReduceScatter: return reduce_scatter_on_gpu(op.input, op.output, op.reduce, o);
      case OpKind::AllToAll: return all_to_all_on_gpu(op.input, op.output, o);
      case OpKind::Barrier: return barrier_on_gpu(o);
      case OpKind::Send: return send_on_gpu(op.input, op.peer, o);
      case OpKind::Recv: return recv_on_gpu(op.output, op.peer, o);
    }
    throw InvalidArgument(std::string("NCCL: unknown operation ") + op_kind_name(op.kind));
  }

  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& ranks) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    const bool member = it != ranks.end();
    const int position = member ? static_cast<int>(it - ranks.begin()) : -1;
    // Every rank takes part in the split; the key orders members as `ranks` lists them.
    ncclComm_t child = comm_->split(member ? 0 : NCCL_SPLIT_NOCOLOR, member ? position : rank(), connect_timeout_);
    if (!member) return nullptr;
    auto comm = std::make_shared<Communicator>(child, comm_->device(), timeout_, comm_->watch()->narrow(ranks));
    return std::make_shared<NcclProcessGroup>(position, static_cast<int>(ranks.size()), std::move(comm), timeout_,
                                              connect_timeout_);
  }

 private:
  Work all_reduce_on_gpu(Buffer buf, ReduceOp op, const CollectiveOptions& o) {
    if (buf.count == 0) return barrier_on_gpu(o);
    return enqueue("all_reduce", o, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(buf.data, buf.data, buf.count, nccl_dtype(buf.dtype), nccl_op(op), c, s);
    });
  }

  Work broadcast_on_gpu(Buffer buf, int root, const CollectiveOptions& o) {
    if (buf.count == 0) return barrier_on_gpu(o);
    return enqueue("broadcast", o, [=](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(buf.data, buf.data, buf.count, nccl_dtype(buf.dtype), root, c, s);
    });
  }

  Work reduce_on_gpu(Buffer buf, int root, ReduceOp op, const CollectiveOptions& o) {
    if (buf.count == 0) return barrier_on_gpu(o);
    // recvbuff is only written on root, so the other ranks' buf stays as it was.
    return enqueue("reduce", o, [=](ncclComm_t c, cudaStream_t s) {
      return ncclReduce(buf.data, buf.data, buf.count, nccl_dtype(buf.dtype), nccl_op(op), root, c, s);
    });
  }

  Work all_gather_on_gpu(Buffer input, Buffer output, const CollectiveOptions& o) {
    if (input.count == 0) return barrier_on_gpu(o);
    return enqueue("all_gather", o, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(input.data, output.data, input.count, nccl_dtype(input.dtype), c, s);
    });
  }

  Work gather_on_gpu(Buffer input, Buffer output, int root, const CollectiveOptions& o) {
    if (input.count == 0) return barrier_on_gpu(o);
    const bool is_root = rank() == root;
    const int n = size();
    return enqueue("gather", o, [=](ncclComm_t c, cudaStream_t s) {
      return grouped([&] {
        ncclDataType_t t = nccl_dtype(input.dtype);
        ncclResult_t r = ncclSend(input.data, input.count, t, root, c, s);
        for (int peer = 0; is_root && peer < n && r == ncclSuccess; ++peer) {
          r = ncclRecv(output.slice(peer * input.count, input.count).data, input.count, t, peer, c, s);
        }
        return r;
      });
    });
  }

  Work scatter_on_gpu(Buffer input, Buffer output, int root, const CollectiveOptions& o) {
    if (output.count == 0) return barrier_on_gpu(o);
    const bool is_root = rank() == root;
    const int n = size();
    return enqueue("scatter", o, [=](ncclComm_t c, cudaStream_t s) {
      return grouped([&] {
        ncclDataType_t t = nccl_dtype(output.dtype);
        ncclResult_t r = ncclSuccess;
        for (int peer = 0; is_root && peer < n && r == ncclSuccess; ++peer) {
          r = ncclSend(input.slice(peer * output.count, output.count).data, output.count, t, peer, c, s);
        }
        if (r == ncclSuccess) r = ncclRecv(output.data, output.count, t, root, c, s);
        return r;
      });
    });
  }

  Work reduce_scatter_on_gpu(Buffer input, Buffer output, ReduceOp op, const CollectiveOptions& o) {
    if (output.count == 0) return barrier_on_gpu(o);
    return enqueue("reduce_scatter", o, [=](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(input.data, output.data, output.count, nccl_dtype(output.dtype), nccl_op(op), c, s);
    });
  }

  Work all_to_all_on_gpu(Buffer input, Buffer output, const CollectiveOptions& o) {
    if (input.count == 0) return barrier_on_gpu(o);
    const size_t block = input.count / size();
    const int n = size();
    return enqueue("all_to_all", o, [=](ncclComm_t c, cudaStream_t s) {
      return grouped([&] {
        ncclDataType_t t = nccl_dtype(input.dtype);
        ncclResult_t r = ncclSuccess;
        for (int peer = 0; peer < n && r == ncclSuccess; ++peer) {
          r = ncclSend(input.slice(peer * block, block).data, block, t, peer, c, s);
          if (r == ncclSuccess) r = ncclRecv(output.slice(peer * block, block).data, block, t, peer, c, s);
        }
        return r;
      });
    });
  }

  Work barrier_on_gpu(const CollectiveOptions& o) {
    int32_t* scratch = comm_->scratch();
    return enqueue("barrier", o, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, c, s);
    });
  }

  Work send_on_gpu(Buffer buf, int dst, const CollectiveOptions& o) {
    return enqueue("send", o, [=](ncclComm_t c, cudaStream_t s) {
      return ncclSend(buf.data, buf.count, nccl_dtype(buf.dtype), dst, c, s);
    });
  }

  Work recv_on_gpu(Buffer buf, int src, const CollectiveOptions& o) {
    return enqueue("recv", o, [=](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(buf.data, buf.count, nccl_dtype(buf.dtype), src, c, s);
    });
  }

  // Enqueues on the group's stream; a blocking call then waits for the Work (bounded
  // by the operation's timeout, which aborts the communicator when it passes).
  template <typename Enqueue>
  Work enqueue(const char* what, const CollectiveOptions& o, Enqueue&& body) {
    Millis timeout = o.timeout.count() > 0 ? o.timeout : timeout_;
    Work work(comm_->launch(what, timeout, std::forward<Enqueue>(body)));
    if (!o.async_op) work.wait();
    return work;
  }

  std::shared_ptr<Communicator> comm_;
  Millis timeout_;          // default limit of every operation
  Millis connect_timeout_;  // limit of forming subgroups
};

}  // namespace

std::string exchange_nccl_unique_id(rdzv::Store& store, const std::string& key, int rank, Millis timeout) {
  if (rank == 0) {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw Error("ncclGetUniqueId failed: " + nccl_text(r, nullptr));
    std::string bytes(id.internal, sizeof(id.internal));
    try {
      store.set(key, bytes);
    } catch (const rdzv::StoreError& e) {
      throw Error("publishing the NCCL unique id under '" + key + "': " + e.what());
    }
    return bytes;
  }
  std::string bytes;
  try {
    bytes = store.get(key, timeout);
  } catch (const rdzv::StoreTimeout&) {
    throw Timeout("rank " + std::to_string(rank) + " waited " + ms_text(timeout) +
                  " for rank 0's NCCL unique id (store key '" + key + "')");
  } catch (const rdzv::StoreError& e) {
    throw Error("reading the NCCL unique id from the store: " + std::string(e.what()));
  }
  if (bytes.size() != sizeof(ncclUniqueId::internal)) {
    throw Error("the NCCL unique id under '" + key + "' has " + std::to_string(bytes.size()) + " bytes, expected " +
                std::to_string(sizeof(ncclUniqueId::internal)));
  }
  return bytes;
}

bool nccl_usable(int local_size) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the error for later CUDA calls
    return false;
  }
  return count > 0 && local_size <= count;
}

std::shared_ptr<ProcessGroup> make_nccl_group(const GroupSetup& setup) {
  if (setup.size < 1 || setup.rank < 0 || setup.rank >= setup.size) {
    throw InvalidArgument("NCCL group: rank " + std::to_string(setup.rank) + " of " + std::to_string(setup.size));
  }
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("the nccl backend needs a GPU, but CUDA reports: ") + cudaGetErrorString(e));
  }
  // GPU local_rank, as torchrun programs do; but when a launcher gave each process one
  // GPU of its own (srun --gpus-per-task: one task per node in the group's view, or
  // CUDA_VISIBLE_DEVICES per task) the only visible device is this rank's.
  const int device = devices == 1 && setup.local_size == 1 ? 0 : setup.local_rank;
  if (device < 0 || device >= devices) {
    throw Error("the nccl backend puts local rank " + std::to_string(setup.local_rank) + " on GPU " +
                std::to_string(device) + ", but " + std::to_string(devices) + " GPU(s) are visible");
  }
  // NCCL takes the current device as the communicator's; it stays current for the
  // caller too, which is what a one-GPU-per-process program expects.
  check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  std::string id = exchange_nccl_unique_id(*setup.store, contract::group_keys::nccl_unique_id(), setup.rank, setup.connect_timeout);
  auto watch = std::make_shared<const PeerWatch>(*setup.store, setup.rank, setup.size, setup.connect_timeout);
  ncclComm_t comm = init_communicator(id, setup.size, setup.rank, setup.connect_timeout);
  auto communicator = std::make_shared<Communicator>(comm, device, setup.timeout, std::move(watch));
  return std::make_shared<NcclProcessGroup>(setup.rank, setup.size, std::move(communicator), setup.timeout,
                                            setup.connect_timeout);
}

}  // namespace ddp::detail
