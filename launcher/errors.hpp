// Error types the launcher throws; main() turns each into one line on stderr and
// an exit status (UsageError: 2, LaunchError: 1).
#pragma once

#include <stdexcept>

namespace ddprun {

// The command line is wrong: an unknown flag, a value out of range, a missing program.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The command line is fine but the launch cannot go ahead: a program that does not
// exist, an unwritable log dir, a port in use, no GPU for --nproc_per_node=gpu.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitUsage = 2;
inline constexpr int kExitLaunch = 1;
// --stall_action=stop ended a job that made no progress (as timeout(1) exits).
inline constexpr int kExitStalled = 124;
// The job ended because a node was lost (its ddprun killed, frozen or cut off; the
// store's host gone), not because a worker exited: every other node exits with this,
// so a scheduler can tell a lost node from the program's own exit statuses
// (sysexits.h's EX_TEMPFAIL: trying again may succeed).
inline constexpr int kExitNodeLost = 75;

}  // namespace ddprun
