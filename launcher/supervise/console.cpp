#include "supervise/console.hpp"

#include <unistd.h>

#include <chrono>

#include "supervise/write_fully.hpp"

namespace ddprun {

Console& Console::out() {
  static Console* c = new Console(STDOUT_FILENO);  // never destroyed: its thread may sit in write()
  return *c;
}

Console& Console::err() {
  static Console* c = new Console(STDERR_FILENO);
  return *c;
}

void Console::write(std::string data) {
  if (data.empty()) return;
  std::lock_guard lock(mutex_);
  if (broken_) return;
  if (!started_) {
    started_ = true;
    std::thread([this] { run(); }).detach();  // lives until the process exits
  }
  queued_bytes_ += data.size();
  if (queued_bytes_ + writing_bytes_ > kHighWater) over_high_ = true;
  queue_.push_back(std::move(data));
  wake_.notify_one();
}

size_t Console::backlog() const {
  std::lock_guard lock(mutex_);
  return queued_bytes_ + writing_bytes_;
}

void Console::on_drained(std::function<void()> fn) {
  std::lock_guard lock(mutex_);
  on_drained_ = std::move(fn);
}

bool Console::flush(int stall_ms) {
  std::unique_lock lock(mutex_);
  while (true) {
    size_t progress = written_total_;
    if (drained_.wait_for(lock, std::chrono::milliseconds(stall_ms),
                          [this] { return broken_ || queued_bytes_ + writing_bytes_ == 0; })) {
      return true;
    }
    if (written_total_ == progress) return false;  // nothing got out for stall_ms
  }
}

void Console::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return !queue_.empty(); });
    // Take everything queued and write it as one batch (whole lines stay whole).
    std::string batch;
    for (auto& piece : queue_) batch += piece;
    queue_.clear();
    writing_bytes_ = batch.size();
    queued_bytes_ = 0;
    lock.unlock();
    bool ok = write_fully(fd_, batch) == batch.size();
    lock.lock();
    written_total_ += batch.size();
    writing_bytes_ = 0;
    if (!ok) {
      broken_ = true;  // e.g. EPIPE: the job goes on without a console copy
      queue_.clear();
      queued_bytes_ = 0;
    }
    std::function<void()> notify;
    if (over_high_ && queued_bytes_ < kLowWater) {
      over_high_ = false;
      notify = on_drained_;
    }
    drained_.notify_all();  // flush() checks for completion and progress
    if (notify) {
      lock.unlock();
      notify();
      lock.lock();
    }
  }
}

}  // namespace ddprun
