// How the job policy words what it says about an attempt: the failure summary, the
// note on incomplete logs, the exception a failed worker left. The policy decides
// when and to whom; this says what (ddprun: diagnose/summary.hpp and the workers'
// error files, bound in job_adapters.hpp at the launcher's root).
#pragma once

#include <string>

#include "job/attempt_result.hpp"

namespace ddprun {

class FailureReports {
 public:
  virtual ~FailureReports() = default;
  // The failure summary of `attempt`: root cause first, then every worker. `next`: what
  // the job does next when it goes on (re-forms), or empty when it ends.
  virtual std::string failure_summary(const AttemptResult& result, int attempt, const std::string& next) const = 0;
  // One line naming the worker logs of an attempt that succeeded which are incomplete
  // (writing them failed); empty when every log is whole.
  virtual std::string incomplete_logs(const AttemptResult& result) const = 0;
  // The exception a failed worker left in its error file ("ValueError: bad"), or empty.
  virtual std::string worker_exception(const WorkerOutcome& worker) const = 0;
};

}  // namespace ddprun
