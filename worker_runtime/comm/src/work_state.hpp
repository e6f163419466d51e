// What a backend shares with the Work handles it returns (internal).
//
// The default State is completed by whoever runs the operation (the CPU backend's
// progress thread or the caller); a backend whose completion is observed rather than
// signalled (NCCL: a CUDA event) derives and overrides poll().
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>

#include "ddp/work.hpp"

namespace ddp {

struct Work::State {
  virtual ~State() = default;

  // Marks the operation finished (error: nullptr on success) and wakes waiters.
  void complete(std::exception_ptr error = nullptr);

  // Waits until finished or `timeout` passed; returns whether finished.
  virtual bool wait_for(Millis timeout);
  virtual bool finished();

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  Work::Timing timing;  // filled by backends that record it
};

}  // namespace ddp
