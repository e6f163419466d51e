// The NCCL backend's communicator (internal): one ncclComm_t with its stream,
// completion events and broken state, and how operations are enqueued on it with a
// timeout. The backend (nccl_backend.cpp) says what to enqueue.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "flight_recorder.hpp"
#include "peer_watch.hpp"
#include "work_state.hpp"

namespace ddp::nccl {

using Clock = std::chrono::steady_clock;

// now + timeout, saturating at the clock's end.
Clock::time_point deadline_after(Millis timeout);
std::string ms_text(Millis t);  // "1500 ms"
// "unhandled system error (run with NCCL_DEBUG=INFO for details): <last error>"
std::string nccl_text(ncclResult_t r, ncclComm_t comm);
// Throws Error("NCCL backend: <what>: <CUDA's text>") unless `e` is cudaSuccess.
void check_cuda(cudaError_t e, const std::string& what);

// Forms the communicator of rank `rank` of `size` from rank 0's unique id within
// `timeout`. Throws PeerError at once when `watch` sees a rank gone, Timeout when not
// every rank joined in time, Error otherwise.
ncclComm_t init_communicator(const std::string& id_bytes, int size, int rank, Millis timeout,
                             const detail::PeerWatch& watch);

// One call as errors name it. Cheap to copy (short strings); the name is built only
// when an error needs it.
struct CallId {
  std::string what;   // "all_reduce"
  uint64_t seq = 0;   // Op::seq (0: none)
  std::string group;  // the group's name ("0", "0.1")
  int peer = -1;      // the one rank a send or recv waits on; -1: every rank
  // "all_reduce #57 of group 0".
  std::string label() const;
};

// The group and every Work it returned hold it, so it lives while operations are
// pending. After a timeout, an asynchronous NCCL error, a call NCCL refused, the
// death of a peer on this host or fail(), the ncclComm_t is aborted and every later
// call fails with the first error.
class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // Takes ownership of `comm` (formed on `device`); `timeout` bounds the drain at
  // destruction; `watch` tells when a peer on this host died.
  Communicator(ncclComm_t comm, int device, Millis timeout, std::shared_ptr<const detail::PeerWatch> watch);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int device() const { return device_; }
  const std::shared_ptr<const detail::PeerWatch>& watch() const { return watch_; }
  int32_t* scratch() const { return scratch_; }

  // Enqueues one operation: `enqueue(comm, stream)` issues its NCCL calls and returns
  // NCCL's result. Returns the Work state that completes with it. Throws the error
  // the communicator broke with; a call NCCL refuses (ncclInvalidArgument or
  // ncclInvalidUsage) breaks it with InvalidArgument, as NCCL then refuses every
  // later call on a non-blocking communicator.
  template <typename Enqueue>
  std::shared_ptr<Work::State> launch(CallId call, Millis timeout, Enqueue&& enqueue) {
    return launch_erased(std::move(call), timeout, &enqueue, [](void* e, ncclComm_t c, cudaStream_t s) {
      return (*static_cast<std::remove_reference_t<Enqueue>*>(e))(c, s);
    });
  }

  // Splits this communicator (collective over all its ranks). Returns the new
  // communicator, or nullptr for color NCCL_SPLIT_NOCOLOR. A rank `waits_on` sees
  // gone ends the wait at once (a member watches the other members: a rank left out
  // may leave as soon as its own part is done).
  ncclComm_t split(int color, int key, Millis timeout, const detail::PeerWatch& waits_on);

  // The error this communicator broke with, after checking the peers `during` waits
  // on (a gone one breaks it; the error names the call) and NCCL's asynchronous
  // error state. nullptr while healthy.
  std::exception_ptr check(const CallId& during);
  // Breaks the communicator with `reason` (the first reason is kept) and aborts it.
  void fail(std::exception_ptr reason);
  std::exception_ptr broken();

  // A pooled completion event, or a new one; `check` answers a CUDA error creating it.
  cudaEvent_t take_event(const std::function<void(cudaError_t)>& check);
  void give_event(cudaEvent_t e);

  // A Work dropped before anyone saw its operation end hands over its completion
  // event and flight-recorder entry: the entry is closed once the event fired (or a
  // later operation's did, the stream being in order), so the group never looks stuck
  // in a call nobody waits for.
  // `ticket` is the operation's number on this communicator (launch order).
  void orphan(uint64_t ticket, cudaEvent_t e, std::shared_ptr<detail::FlightRecorder> recorder, uint64_t record);
  // Closes the entries of orphans whose events fired, and of those numbered up to
  // `done_through` (a later operation's event fired: the stream runs in order).
  void close_orphans(uint64_t done_through = 0);

 private:
  using EnqueueFn = ncclResult_t (*)(void* enqueue, ncclComm_t comm, cudaStream_t stream);
  std::shared_ptr<Work::State> launch_erased(CallId call, Millis timeout, void* enqueue, EnqueueFn fn);
  void release();

  std::mutex mu_;                   // serialises every NCCL call on comm_ (not thread-safe)
  ncclComm_t comm_ = nullptr;       // nullptr once aborted
  const int device_;                // the GPU the communicator was formed on
  const Millis timeout_;            // bounds the drain in the destructor
  const std::shared_ptr<const detail::PeerWatch> watch_;  // this host's peers, by pidfd
  cudaStream_t stream_ = nullptr;   // every operation runs here, in issue order
  cudaEvent_t ready_ = nullptr;     // orders each operation after the default stream's work
  int32_t* scratch_ = nullptr;      // one device int for barrier()
  std::atomic<bool> stop_{false};   // raised by fail()

  std::mutex broken_mu_;
  std::exception_ptr broken_;       // the first error; set once

  std::mutex events_mu_;
  std::vector<cudaEvent_t> free_events_;  // completion events ready for reuse
  uint64_t launched_ = 0;           // operations enqueued so far (under mu_): their tickets
  struct Orphan {
    uint64_t ticket;
    cudaEvent_t event;
    std::shared_ptr<detail::FlightRecorder> recorder;
    uint64_t record;
  };
  std::deque<Orphan> orphans_;            // in issue order (under events_mu_)
};

}  // namespace ddp::nccl
