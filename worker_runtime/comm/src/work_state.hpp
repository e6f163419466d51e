// What a backend shares with the Work handles it returns (internal).
//
// The default State is completed by whoever runs the operation (the CPU backend's
// progress thread or the caller); a backend whose completion is observed rather than
// signalled (NCCL: a CUDA event) derives and overrides poll().
//
// A State attached to a call (attach) keeps the call's flight-recorder entry: the
// backend marks it started, and complete() marks it completed or failed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

#include "backend.hpp"
#include "ddp/work.hpp"

namespace ddp {

struct Work::State {
  virtual ~State() = default;

  // Marks the operation finished (error: nullptr on success) and wakes waiters;
  // `ran`, where known, is when it ran (timing).
  void complete(std::exception_ptr error = nullptr, const Work::Timing& ran = {});

  // This State is the Work of `call` (no-op where its group records nothing). A
  // backend that may complete it after the group is gone (one that observes
  // completion, as NCCL) asks to keep the recorder alive; the others complete every
  // Work before their group ends and save the reference count.
  void attach(const detail::Op& call, bool keep_recorder_alive = false);
  // The backend began the call at `t`.
  void mark_started(std::chrono::steady_clock::time_point t);
  // Makes a State that nobody else holds any more ready for another call, as if new
  // (a backend reuses its last State instead of allocating one per call).
  void reset();

  // Waits until finished or `timeout` passed; returns whether finished.
  virtual bool wait_for(Millis timeout);
  virtual bool finished();

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  Work::Timing timing;  // filled by backends that record it
  detail::FlightRecorder* recorder = nullptr;  // the call's recorder, or null
  uint64_t record = 0;                         // its entry there
  std::shared_ptr<detail::FlightRecorder> recorder_owner;  // with keep_recorder_alive
};

}  // namespace ddp
