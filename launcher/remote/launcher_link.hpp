// The agent's side of a launch from one command (`ddprun --agent_stdin`, started by a
// launching ddprun over ssh or as its child): the handoff on stdin, then the pipe kept
// open as the link to the launcher.
//
//   - The handoff's variables are set in this process (so the workers get them) and its
//     token becomes the store token.
//   - The pipe moves off fd 0 (to a private close-on-exec fd; fd 0 becomes /dev/null),
//     so no worker ever reads the launcher's control lines.
//   - A thread reads control lines: "stop N" sends signal N to this ddprun, whose usual
//     stop path takes over. The end of the pipe means the launcher is gone (or this
//     node's ssh connection was cut): SIGTERM to this ddprun, which launcher_lost()
//     then tells from a stop, and a second one (SIGKILL to the workers) once the grace
//     period or half the heartbeat timeout passed, whichever is shorter; 1 s before the
//     heartbeat timeout this ddprun exits outright (status 1) if it is still there (its
//     store is likely gone with the launcher, so it would only wait out timeouts; the
//     kernel kills any worker left: PR_SET_PDEATHSIG), so nothing of the node outlives
//     the heartbeat timeout.
#pragma once

#include "job/attempt_result.hpp"
#include "cli/options.hpp"

namespace ddprun {

// Reads the handoff from fd 0 (within 30 s) and applies it to the environment and to
// `options` (token). Call before any other thread reads the environment. Throws
// LaunchError on a bad or missing handoff.
void join_launcher(LaunchOptions& options);

// Starts the thread that reads the launcher's control lines and watches for its end.
// Call once this ddprun's stop signals have their handlers (the Supervisor exists): a
// stop line turns into a signal to this process, whose default action would kill it
// outright. Until then the launcher's lines wait in the pipe.
void watch_launcher_link(const LaunchOptions& options);

// Whether this agent lost its link to the launcher (its stdin ended without a stop line
// first): the SIGTERM this ddprun then got is no stop anyone asked for, and the node
// counts as lost (status 1).
bool launcher_lost();

// Whether the summary of `result` belongs on the launcher's console from this node:
// its root cause is one of this node's workers, or a stop this node got that did not
// come from the launcher.
bool agent_wants_summary(const AttemptResult& result);

}  // namespace ddprun
