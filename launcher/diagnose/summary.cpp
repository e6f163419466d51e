#include "diagnose/summary.hpp"

#include <string.h>

#include <ctime>
#include <sstream>

#include "supervise/error_files.hpp"

namespace ddprun {
namespace {

std::string utc_time(std::chrono::system_clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char text[64];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof(out), "%s.%03dZ", text, static_cast<int>(ms % 1000));
  return out;
}

void describe_worker(std::ostringstream& os, const LaunchPlan& plan, const WorkerOutcome& w) {
  os << "  rank " << w.rank << " (local_rank " << w.local_rank << ") on " << plan.hostname << ", pid " << w.pid << ": "
     << w.describe();
  if (w.reaped) os << " at " << utc_time(w.ended);
  if (w.ended_after_stop) os << " (stopped by ddprun)";
  os << "\n";
  for (const LogFailure& log : w.incomplete_logs) {
    os << "    log incomplete: " << log.path << " (" << log.error << "); the rest went to the console\n";
  }
}

}  // namespace

std::string format_incomplete_logs(const AttemptResult& result) {
  std::string paths;
  size_t count = 0;
  for (const WorkerOutcome& w : result.workers) {
    for (const LogFailure& log : w.incomplete_logs) {
      paths += (count++ == 0 ? "" : ", ") + log.path + " (" + log.error + ")";
    }
  }
  if (count == 0) return "";
  return std::to_string(count) + " worker log file(s) are incomplete, the rest of their output went to the console: " +
         paths;
}

std::string format_failure_summary(const LaunchPlan& plan, const AttemptResult& result, int attempt,
                                   const std::string& next) {
  std::ostringstream os;
  const std::string rule(72, '=');
  auto then = [&] {
    if (next.empty()) {
      os << "  every node exits with status " << result.remote->status << "\n";
    } else {
      os << "  " << next << "\n";
    }
  };
  os << rule << "\n";
  os << "ddprun: job " << plan.run_id << " (attempt " << attempt << ") ";
  if (result.stop_signal != 0) {
    os << "stopped by SIG" << sigabbrev_np(result.stop_signal) << " (signal " << result.stop_signal
       << ") sent to ddprun\n";
  } else {
    os << "failed\n";
  }
  if (result.remote && !result.remote->report.empty()) {
    os << "Root cause (ddprun stopped a stalled job, --stall_action=stop):\n";
    os << result.remote->report;
    then();
  } else if (result.remote) {
    os << "Root cause (first failure in the job, on another node or of a whole node):\n";
    os << "  " << result.remote->description << "\n";
    then();
  } else if (result.root_cause) {
    const WorkerOutcome& root = result.workers[*result.root_cause];
    os << "Root cause (first worker to fail):\n";
    describe_worker(os, plan, root);
    os << "    log: " << (root.stderr_log.empty() ? "(console only; --log_dir keeps files)" : root.stderr_log) << "\n";
    if (root.stderr_tail.empty()) {
      os << "    its stderr was empty\n";
    } else {
      os << "    last lines of its stderr:\n";
      for (const auto& line : root.stderr_tail) os << "      | " << line << "\n";
    }
    if (auto error = read_worker_error(root.error_file)) {
      // What PyTorch's @record left: the exception and its traceback.
      os << "    exception (from its TORCHELASTIC_ERROR_FILE, written by @record): " << error->message << "\n";
      if (plan.log_root) os << "    error file: " << root.error_file << "\n";  // otherwise removed at exit
      constexpr size_t kTracebackLines = 30;
      const size_t skip = error->traceback.size() > kTracebackLines ? error->traceback.size() - kTracebackLines : 0;
      if (skip > 0) os << "      | (" << skip << " earlier lines of the traceback left out)\n";
      for (size_t i = skip; i < error->traceback.size(); ++i) os << "      | " << error->traceback[i] << "\n";
    }
  }
  bool header = false;
  for (size_t i = 0; i < result.workers.size(); ++i) {
    if (!result.remote && result.root_cause && i == *result.root_cause) continue;
    if (!header) os << (result.remote ? "This node's workers:\n" : result.root_cause ? "Other workers:\n" : "Workers:\n");
    header = true;
    describe_worker(os, plan, result.workers[i]);
  }
  os << rule << "\n";
  return os.str();
}

}  // namespace ddprun
