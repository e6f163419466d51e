// The flight recorder (internal): every process group keeps its last N calls, so a
// hang or a failure can be explained after the fact, and the progress publisher
// (progress_publisher.hpp) can tell ddprun what each rank is doing.
//
// Terms:
//   call    one operation issued on the group (a collective, a send or a recv); the
//           recorder numbers them 1, 2, ... in issue order (its id, apart from
//           Op::seq, which numbers collectives per group and sends/recvs per peer).
//   slot    where a call lives in the ring: call `id` in slot (id - 1) mod capacity.
//   state   queued (issued) -> started (the backend began it) -> completed | failed.
//
// Cost: writing is lock-free and allocation-free. The issuing thread fills a slot;
// the thread that runs the call (the caller or the group's progress thread) marks
// it started and ended. Readers (the publisher, tests) copy a slot under a per-slot
// version (seqlock): a slot that changed while it was read is read again.
//
// A process-wide registry holds every live recorder weakly, so the publisher can
// snapshot every group without the groups knowing it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/contract/job_records.hpp"
#include "backend.hpp"

namespace ddp::detail {

using RecorderClock = std::chrono::steady_clock;

// Now, to the clock's last tick (CLOCK_MONOTONIC_COARSE: a few ns instead of some
// tens, up to a few ms early, never late): when a call was queued. Started and ended
// times come from the backend's own precise reads.
RecorderClock::time_point coarse_now();

enum class CallState : uint8_t { Queued, Started, Completed, Failed };
const char* call_state_name(CallState s);  // "queued", "started", "completed", "failed"

// One recorded call, as read back.
struct CallRecord {
  uint64_t id = 0;   // the recorder's number of the call (from 1, every call)
  uint64_t seq = 0;  // Op::seq
  OpKind kind = OpKind::Barrier;
  size_t count = 0;  // elements this rank moves (the buffer describe_op names)
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  int peer = -1;     // root, dst or src; -1 where there is none
  CallState state = CallState::Queued;
  RecorderClock::time_point queued, started, ended;  // epoch (zero) until reached

  // describe_op() of the call: "all_reduce 262144×f32 sum".
  std::string describe() const;
  // When it entered its present state.
  RecorderClock::time_point since() const;
};

class FlightRecorder : public std::enable_shared_from_this<FlightRecorder> {
 public:
  // A recorder of the last `entries` (> 0) calls of a group of `size` where this
  // process is `rank`, registered in the process-wide registry until destroyed.
  static std::shared_ptr<FlightRecorder> create(size_t entries, int rank, int size);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // The group's name in reports ("0", "0.1"); set once the group is named.
  void set_name(const std::string& name);
  std::string name() const;
  size_t entries() const { return entries_; }
  // Sends and recvs issued and not ended (progress() looks back for them while any).
  uint64_t p2p_open() const {
    const uint64_t ended = p2p_ended_.load(std::memory_order_acquire);
    return p2p_issued_.load(std::memory_order_acquire) - ended;
  }

  // Records `op` (numbered already) as queued at `now`; returns its id. Only the
  // thread that issues the group's calls calls this.
  uint64_t queued(const Op& op, RecorderClock::time_point now);
  // The backend began call `id` (a call whose slot a newer call took is left alone,
  // and so is the newer call).
  void started(uint64_t id, RecorderClock::time_point t);
  // Call `id` ended at `t` (zero: now): completed when ok, else failed. A call that
  // ended already keeps its first outcome (so a backend and issue() may both say it).
  void ended(uint64_t id, bool ok, RecorderClock::time_point t = {});

  // The calls still held, oldest first (at most entries()).
  std::vector<CallRecord> calls() const;
  // The group as a progress record shows it: collectives in issued, completed,
  // current and last_completed; sends and recvs counted apart, those not completed
  // listed in p2p_pending (the newest kMaxPendingShown, oldest first).
  contract::GroupProgress progress() const;
  static constexpr size_t kMaxPendingShown = 8;

 private:
  FlightRecorder(size_t entries, int rank, int size);
  struct Slot;
  Slot& slot(uint64_t id) const;
  // Takes slot `s` for writing if it holds call `id` (0: whatever it holds).
  static bool claim(Slot& s, uint64_t id);
  std::optional<CallRecord> read(uint64_t id) const;

  const size_t entries_;  // calls kept
  const uint64_t mask_;   // ring capacity - 1 (capacity: entries_ rounded up to a power of two)
  std::unique_ptr<Slot[]> ring_;
  const int rank_;
  const int size_;

  std::atomic<uint64_t> last_id_{0};               // the last call issued
  std::atomic<uint64_t> last_collective_{0};       // id of the last collective issued
  std::atomic<uint64_t> issued_{0};                // collectives issued (their last seq)
  std::atomic<uint64_t> last_completed_{0};        // id of the last collective completed
  std::atomic<uint64_t> completed_{0};             // collectives completed (their last seq)
  // Sends and recvs only (a collective never touches them): issued (written by the
  // issuing thread alone), ended and failed (progress() looks for pending ones only
  // while issued > ended; completed = ended - failed), and the id of the last to complete.
  // A pending one whose slot a newer call takes counts as ended and failed then (its
  // own end, unseen, would have left it open for good).
  std::atomic<uint64_t> p2p_issued_{0};
  std::atomic<uint64_t> p2p_ended_{0};
  std::atomic<uint64_t> p2p_failed_{0};
  std::atomic<uint64_t> last_p2p_completed_{0};

  mutable std::mutex name_mu_;  // name_ only (never taken per call)
  std::string name_ = "0";
};

// The progress of every live group of this process (those that record), in the
// order they were made.
std::vector<contract::GroupProgress> all_group_progress();
// Every live recorder, in the order they were made (for tests and dumps).
std::vector<std::shared_ptr<FlightRecorder>> all_recorders();
// `listener` runs (on the failing call's thread, briefly) whenever a recorded call of
// any group fails; returns a handle for remove_failure_listener.
int add_failure_listener(std::function<void()> listener);
void remove_failure_listener(int handle);

// DDP_FLIGHT_RECORDER (default 2000; 0: groups record nothing).
size_t configured_recorder_entries();

}  // namespace ddp::detail
