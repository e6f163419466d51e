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

// `next` says what the job does after it when that is not the end on every node (an
// elastic job re-forming: "the job re-forms without the lost node (restart 1 of 3)");
// empty: a failure that came from elsewhere says "every node exits with status N".
std::string format_failure_summary(const LaunchPlan& plan, const AttemptResult& result, int attempt,
                                   const std::string& next = {});

// One line naming the worker log files of `result` that are incomplete (writing them
// failed), for a job that succeeded; empty when every log is whole.
std::string format_incomplete_logs(const AttemptResult& result);

}  // namespace ddprun
