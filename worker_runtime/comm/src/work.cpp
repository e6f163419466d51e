#include <string>

#include "ddp/types.hpp"
#include "flight_recorder.hpp"
#include "work_state.hpp"

namespace ddp {

void Work::State::complete(std::exception_ptr e, const Work::Timing& ran) {
  {
    std::lock_guard lock(mu);
    if (done) return;
    if (ran.known) timing = ran;
    // Recorded before any waiter wakes: a call that returned shows as ended.
    if (recorder) recorder->ended(record, e == nullptr, timing.known ? timing.end : detail::RecorderClock::time_point{});
    done = true;
    error = std::move(e);
  }
  cv.notify_all();
}

void Work::State::attach(const detail::Op& call, bool keep_recorder_alive) {
  if (!call.recorder) return;
  recorder = call.recorder;
  record = call.record;
  if (keep_recorder_alive) recorder_owner = call.recorder->shared_from_this();
}

void Work::State::reset() {
  done = false;
  error = nullptr;
  timing = {};
  recorder = nullptr;
  record = 0;
  recorder_owner.reset();
}

void Work::State::mark_started(std::chrono::steady_clock::time_point t) {
  if (recorder) recorder->started(record, t);
}

bool Work::State::wait_for(Millis timeout) {
  std::unique_lock lock(mu);
  if (timeout == Millis::max()) {
    cv.wait(lock, [&] { return done; });
    return true;
  }
  return cv.wait_for(lock, timeout, [&] { return done; });
}

bool Work::State::finished() {
  std::lock_guard lock(mu);
  return done;
}

void Work::wait(Millis timeout) const {
  if (!state_) return;
  if (!state_->wait_for(timeout)) {
    throw Timeout("wait(): the operation did not finish within " + std::to_string(timeout.count()) + " ms");
  }
  std::exception_ptr e;
  {
    std::lock_guard lock(state_->mu);
    e = state_->error;
  }
  if (e) std::rethrow_exception(e);
}

bool Work::is_completed() const { return !state_ || state_->finished(); }

std::exception_ptr Work::exception() const {
  if (!state_) return nullptr;
  std::lock_guard lock(state_->mu);
  return state_->error;
}

Work::Timing Work::timing() const {
  if (!state_) return {};
  std::lock_guard lock(state_->mu);
  return state_->timing;
}

namespace {
void wait_quietly(const Work& w) noexcept {
  try {
    w.wait();
  } catch (...) {
  }
}
}  // namespace

void wait_all(std::span<Work> works) {
  std::exception_ptr first;
  for (const Work& w : works) {
    try {
      w.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void wait_all_noexcept(std::span<Work> works) noexcept {
  for (const Work& w : works) wait_quietly(w);
}

void wait_all_noexcept(std::initializer_list<Work*> works) noexcept {
  for (const Work* w : works) wait_quietly(*w);
}

}  // namespace ddp
