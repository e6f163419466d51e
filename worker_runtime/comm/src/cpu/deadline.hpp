// The clock of the CPU transport and deadlines on it: every wait of the mesh, the
// progress engine and the algorithms ends at a Clock::time_point.
#pragma once

#include <chrono>

#include "ddp/work.hpp"  // Millis

namespace ddp::cpu {

using Clock = std::chrono::steady_clock;

// now + timeout, saturating (a timeout of Millis::max() means no limit).
inline Clock::time_point deadline_after(Millis timeout) {
  const auto now = Clock::now();
  const auto room = std::chrono::duration_cast<Millis>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

}  // namespace ddp::cpu
