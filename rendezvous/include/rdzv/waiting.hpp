// One way to wait for what may take a while (peers joining a group, a store coming
// up, nodes registering, peers connecting), for the worker runtime and the launcher
// alike: in slices, each a try that blocks at most its budget, until it arrives, a
// deadline passes or the waiter is told to stop; and every so often (the workers' and
// ddprun's DDP_WAIT_NOTICE_SEC) a notice saying what is still missing, so a wait that
// hangs says whom it waits for.
#pragma once

#include <chrono>
#include <functional>
#include <string>


namespace rdzv {

using Millis = std::chrono::milliseconds;

struct Waiting {
  Millis timeout = Millis::max();           // give up after this (max: never)
  Millis slice = Millis::max();             // the longest one try may block
  Millis notice_every{30000};               // 0: no notices (DDP_WAIT_NOTICE_SEC sets it)
  // A try that fails at once (a refused connection cannot be waited for) is followed
  // by a pause of the rest of this before the next try; 0: none.
  Millis retry_pause{0};
  // The notice, asked for when one is due: "ddp: rank 3 still waiting for ranks 1, 2
  // to join the process group". The wait adds how long so far: " (12 s of 300 s)".
  std::function<std::string()> describe;
  // Where notices go; unset: one line on stderr.
  std::function<void(const std::string&)> say;
  // Asked before every try: true ends the wait.
  std::function<bool()> cancelled;
};

enum class WaitEnd {
  kArrived,    // a try said so
  kTimedOut,   // the timeout passed (after at least one try)
  kCancelled,  // cancelled() said so
};

// Calls try_once(budget) until it returns true. Each budget is the least of the
// slice, what is left of the timeout and the time to the next notice (0 only when
// the timeout is); a try should block no longer than its budget. An exception from
// a try ends the wait and propagates.
WaitEnd wait_in_slices(const Waiting& w, const std::function<bool(Millis budget)>& try_once);

}  // namespace rdzv
