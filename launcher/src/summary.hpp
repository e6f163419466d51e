// The failure summary ddprun prints on stderr when a job fails or is stopped:
// the root cause first (rank, local rank, host, pid, exit code or signal, time,
// log file, last lines of its stderr), then every other worker's outcome.
#pragma once

#include <string>

#include "launch_plan.hpp"
#include "attempt_result.hpp"

namespace ddprun {

std::string format_failure_summary(const LaunchPlan& plan, const AttemptResult& result, int attempt);

}  // namespace ddprun
