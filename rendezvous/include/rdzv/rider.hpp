// Work that rides on a store client's link thread (rdzv/tcp_store.hpp) for an owner on
// another thread: a worker's exit watch and progress records, a node's heartbeat and
// exit records. Each step runs under the rider's mutex and only until the owner stops
// it, so once stop() returns no step runs or touches the client again, and the owner
// may let go of it.
//
// Steps hold the rider by shared_ptr (it lives as long as a completion or task may
// still run); the rider holds the client by plain reference, never owning it: a step
// must not be what destroys the client (that would join the link thread from itself).
//
// The fork rule of rdzv/tcp_store.hpp, for every rider: in a forked child the owner
// neither stops it (the parent's link thread may have held the mutex at the fork) nor
// destroys it (its condition variables may count parent threads' waits):
// abandoned_in_child().
#pragma once

#include <memory>
#include <mutex>

#include "rdzv/tcp_store.hpp"

namespace rdzv {

class Rider {
 public:
  explicit Rider(TcpStore& store) : store_(store) {}

  // Runs fn(store) unless stopped. Steps of one rider run one at a time.
  template <typename Fn>
  void ride(Fn&& fn) {
    std::lock_guard lock(mu_);
    if (!stopped_) fn(store_);
  }
  // No step runs after this returns. Not in a forked child: see abandoned_in_child().
  void stop() {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }

 private:
  std::mutex mu_;
  bool stopped_ = false;
  TcpStore& store_;
};

// For an owner's destructor: in a forked child, leaves its rider's state and the
// parent's client as they are, never destroyed here, and returns true (the owner does
// nothing more). In the process that made the client: false.
template <typename State>
bool abandoned_in_child(std::shared_ptr<State>& state, std::shared_ptr<TcpStore>& store) {
  if (!store->forked()) return false;
  (void)new std::shared_ptr<State>(std::move(state));
  (void)new std::shared_ptr<TcpStore>(std::move(store));
  return true;
}

}  // namespace rdzv
