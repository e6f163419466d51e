// wait_in_slices (waiting.hpp): the one loop that waits in slices and gives notices.
#include "rdzv/waiting.hpp"

#include <algorithm>
#include <cstdio>
#include <thread>

namespace rdzv {
namespace {

using Clock = std::chrono::steady_clock;

long long whole_seconds(Clock::duration d) { return std::chrono::round<std::chrono::seconds>(d).count(); }

// `start` plus `span`, saturating at "never" instead of overflowing.
Clock::time_point after(Clock::time_point start, Millis span) {
  if (span >= std::chrono::duration_cast<Millis>(Clock::time_point::max() - start)) return Clock::time_point::max();
  return start + span;
}

}  // namespace

WaitEnd wait_in_slices(const Waiting& w, const std::function<bool(Millis budget)>& try_once) {
  const auto start = Clock::now();
  const auto deadline = after(start, w.timeout);
  const bool noticing = w.notice_every.count() > 0 && w.describe;
  auto next_notice = noticing ? after(start, w.notice_every) : Clock::time_point::max();
  for (;;) {
    if (w.cancelled && w.cancelled()) return WaitEnd::kCancelled;
    const auto tried = Clock::now();
    const auto until = std::min(deadline, next_notice);
    const Millis budget = until == Clock::time_point::max()
                              ? w.slice
                              : std::clamp(std::chrono::ceil<Millis>(until - tried), Millis(0), w.slice);
    if (try_once(budget)) return WaitEnd::kArrived;
    auto now = Clock::now();
    if (now >= deadline) return WaitEnd::kTimedOut;
    if (now - tried < w.retry_pause) {
      std::this_thread::sleep_until(std::min({tried + w.retry_pause, deadline, next_notice}));
      now = Clock::now();
    }
    if (now >= next_notice) {
      std::string text = w.describe() + " (" + std::to_string(whole_seconds(now - start)) + " s";
      if (deadline != Clock::time_point::max()) text += " of " + std::to_string(whole_seconds(deadline - start)) + " s";
      text += ")";
      if (w.say) {
        w.say(text);
      } else {
        std::fprintf(stderr, "%s\n", text.c_str());
      }
      while (next_notice <= now) next_notice += w.notice_every;
    }
  }
}

}  // namespace rdzv
