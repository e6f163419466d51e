// The job policy's view of this node's worker processes (the Supervisor, bound in
// job_adapters.hpp at the launcher's root; fakes in tests).
#pragma once

#include "job/attempt_result.hpp"
#include "job/job_layout.hpp"

namespace ddprun {

// This node's workers.
class Workers {
 public:
  virtual ~Workers() = default;
  // Readies attempt `attempt` before this node joins it (its log folders). Throws LaunchError.
  virtual void prepare(int attempt) = 0;
  // Runs this node's workers for `attempt` until they and everything they started are
  // gone. hooks.on_worker_exit runs on the calling thread for every worker reaped,
  // hooks.on_local_failure for the first worker to fail.
  // Throws LaunchError when the workers cannot be started.
  virtual AttemptResult run(int attempt, const JobLayout& layout, const AttemptHooks& hooks) = 0;
  // Stops `attempt` because the job failed elsewhere. Safe from any thread; ignored
  // unless that attempt is running and not already stopping.
  virtual void stop_for_remote(int attempt, RemoteCause cause) = 0;
};

}  // namespace ddprun
