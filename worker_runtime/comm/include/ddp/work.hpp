// The handle of a collective that may still be running.
//
// Every collective returns a Work. A blocking call (the default) returns one that
// is already complete; with CollectiveOptions::async_op the call returns at once
// and wait() blocks until the operation finished, rethrowing its error.
#pragma once

#include <chrono>
#include <exception>
#include <initializer_list>
#include <memory>
#include <span>

namespace ddp {

using Millis = std::chrono::milliseconds;

class Work {
 public:
  struct State;  // shared with the backend that completes it
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Blocks until the operation finished. Rethrows its error (PeerError, Timeout,
  // Error). Throws Timeout if it has not finished within `timeout` (the operation
  // itself keeps running and is bounded by its group's timeout). A default-made
  // Work counts as complete.
  void wait(Millis timeout = Millis::max()) const;
  // True once the operation finished, with or without an error (never blocks).
  bool is_completed() const;
  // The operation's error, or nullptr (only meaningful once completed).
  std::exception_ptr exception() const;

  // When the operation ran (known once completed, on backends that record it:
  // the CPU backend does; for timelines).
  struct Timing {
    std::chrono::steady_clock::time_point start, end;
    bool known = false;
  };
  Timing timing() const;

 private:
  std::shared_ptr<State> state_;
};

// Waits for every one of `works`, even after one of them failed, then rethrows the
// first error: a caller whose buffers go away when it throws (locals, a pool it frees)
// never leaves an operation still writing them.
void wait_all(std::span<Work> works);
// Waits for every one of `works` and drops their errors: for paths that are already
// failing or tearing down (a destructor, a catch that rethrows) and only need nothing
// left running in their buffers.
void wait_all_noexcept(std::span<Work> works) noexcept;
void wait_all_noexcept(std::initializer_list<Work*> works) noexcept;

}  // namespace ddp
