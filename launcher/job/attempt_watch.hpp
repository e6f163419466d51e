// The job policy's view of what watches an attempt from beside it (stall detection,
// the runtime file of `ddprun status`), and what such a watch may ask of the job.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "job/attempt_result.hpp"
#include "job/job_layout.hpp"

namespace ddprun {

// What a watch beside the attempt (stall detection) may ask for: the job ends with
// this as its root cause, through the usual failure path (every node stops).
struct JobStop {
  int status = 1;         // the status every node exits with
  std::string headline;   // one line, as the other nodes see it
  std::string report;     // this node's failure summary shows it whole
};

// Watches an attempt from beside it: stall detection, the runtime file that
// `ddprun status` reads. Both calls come on ddprun's main thread.
class AttemptWatch {
 public:
  virtual ~AttemptWatch() = default;
  // The attempt's workers started. `stop_job` may be called from any thread until ended().
  virtual void started(int attempt, const JobLayout& layout, const std::vector<WorkerOutcome>& workers,
                       std::function<void(const JobStop&)> stop_job) = 0;
  // The node started stopping the attempt's workers (ended() follows once they are
  // gone). Must not block: it comes from wherever the stop began.
  virtual void stopping(int /*attempt*/) {}
  // The attempt's workers are all gone.
  virtual void ended(int attempt) = 0;
};

}  // namespace ddprun
