// Starting one worker process: fork + execve with the worker in its own session and
// process group, killed by the kernel if ddprun dies (PR_SET_PDEATHSIG), default signal
// dispositions and an empty signal mask, stdout/stderr on the given pipe ends, and
// (with --numa_binding) its CPUs and preferred memory node.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "plan/launch_plan.hpp"

namespace ddprun {

struct SpawnRequest {
  const WorkerCommand* command = nullptr;
  const std::vector<std::string>* environment = nullptr;  // "KEY=VALUE" entries
  int stdout_fd = -1;  // becomes the worker's fd 1
  int stderr_fd = -1;  // becomes the worker's fd 2
  const WorkerBinding* binding = nullptr;  // CPUs and memory node to bind to; nullptr: none
};

// Returns the worker's pid, which is also its process-group id. Throws LaunchError
// when fork fails. An execve failure shows up as the worker exiting with 127 (not
// found) or 126 (not runnable) after one line on its stderr, as in a shell; a binding
// the kernel refuses is a 126 with one line too.
pid_t spawn_worker(const SpawnRequest& request);

}  // namespace ddprun
