// Workers' error files, as torchrun has them: each worker gets TORCHELASTIC_ERROR_FILE,
// a path where PyTorch's @record decorator (torch.distributed.elastic.multiprocessing
// .errors.record) writes the exception that ended it, as JSON:
//
//   {"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "..."}}}
//
// (or {"message": "text", "timestamp": ...}). ddprun reads the file of a worker that
// failed and shows the exception and its traceback in the failure summary.
//
// With --log_dir the files are <log_dir>/<run_id>/attempt_<k>/<local_rank>/error.json,
// kept with the logs; otherwise in a private folder ddprun makes and removes at exit.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/launch_plan.hpp"

namespace ddprun {

// The exception a worker left in its error file.
struct WorkerError {
  std::string message;                 // "ValueError: bad"
  std::vector<std::string> traceback;  // py_callstack, one line each (may be empty)
};

// Reads a worker's error file: nothing when it is absent, empty, too large (1 MiB)
// or not the JSON @record writes.
std::optional<WorkerError> read_worker_error(const std::string& path);
// The same for the file's text (exposed for tests).
std::optional<WorkerError> parse_worker_error(std::string_view json);

class ErrorFiles {
 public:
  explicit ErrorFiles(const LaunchPlan& plan) : plan_(plan) {}
  ~ErrorFiles();  // removes the private folder, if one was made
  ErrorFiles(const ErrorFiles&) = delete;
  ErrorFiles& operator=(const ErrorFiles&) = delete;

  // The error file of `local_rank` in `attempt`, with any file left there from before
  // removed. Empty when no folder could be made for it (the worker then has no
  // TORCHELASTIC_ERROR_FILE, as under a torchrun that could not make one).
  std::string prepare(int attempt, int local_rank);

 private:
  const LaunchPlan& plan_;
  std::string private_dir_;  // made on first use when there is no log folder
  bool private_failed_ = false;
};

}  // namespace ddprun
