// ddprun's console: stdout and stderr written by one helper thread each, so a console
// that stops reading (a paused pager, a full pipe) never blocks the supervisor's loop:
// signals are still forwarded, timers still fire and failures still propagate. The
// loop only queues; when a queue grows past kHighWater the loop stops reading worker
// pipes (the workers then block on their own output, as they would on a terminal)
// until it drains below kLowWater.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ddprun {

class Console {
 public:
  static constexpr size_t kHighWater = 4u << 20;
  static constexpr size_t kLowWater = 1u << 20;

  // The writers for fd 1 and fd 2 (started on first use).
  static Console& out();
  static Console& err();

  // A writer for another fd. Its thread holds `this` until the process exits, so an
  // instance must never be destroyed (allocate it and keep it, as out()/err() do).
  explicit Console(int fd) : fd_(fd) {}

  // Queues bytes; never blocks.
  void write(std::string data);
  // Bytes queued and not yet written.
  size_t backlog() const;
  // Called (on the writer thread) each time the backlog falls below kLowWater after
  // having been above kHighWater.
  void on_drained(std::function<void()> fn);
  // Waits until everything queued is written, or until no byte got out for
  // `stall_ms` (a console that stopped reading for good); false then.
  bool flush(int stall_ms);

 private:
  void run();

  int fd_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;     // writer: data queued
  std::condition_variable drained_;  // flush(): queue empty
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  size_t writing_bytes_ = 0;         // taken off the queue, being written
  size_t written_total_ = 0;         // progress, for flush()
  bool started_ = false;
  bool over_high_ = false;
  bool broken_ = false;              // the reader went away (EPIPE): drop further output
  std::function<void()> on_drained_;
};

}  // namespace ddprun
