// The failure summary ddprun prints on stderr when a job fails or is stopped:
// the root cause first (rank, local rank, host, pid, exit code or signal, time,
// log file, last lines of its stderr, the exception from its TORCHELASTIC_ERROR_FILE),
// then every other worker's outcome; any
// worker whose log file could not be written to the end is marked so.
#pragma once

#include <string>

#include "plan/launch_plan.hpp"
#include "job/attempt_result.hpp"

namespace ddprun {

std::string format_failure_summary(const LaunchPlan& plan, const AttemptResult& result, int attempt);

// One line naming the worker log files of `result` that are incomplete (writing them
// failed), for a job that succeeded; empty when every log is whole.
std::string format_incomplete_logs(const AttemptResult& result);

}  // namespace ddprun
