// Stall detection: each node's ddprun reads every rank's ProgressRecord from the
// job's store (through the node's one store link) four times a second, on a thread
// of its own while an attempt runs, and reports a stall
// once per episode:
//   - no rank completed a call in any group for --stall_timeout seconds while some
//     rank waits in one and this node's workers are alive, or
//   - a record shows a call in state "failed" (a collective that timed out): at once, or
//   - no rank publishes records at all (plain programs, not using the ddprun runtime),
//     every worker of this node is alive and none used CPU time for --stall_timeout
//     seconds: the report then has the process-level part only.
// Every node sees the same records, so every node detects the same stall. Each
// publishes its own workers' part (process state, stacks) under
// JobKeys(attempt).stall_report(node_rank); node 0 collects the parts (a bounded
// wait, naming nodes that did not answer) and prints the one report; the others print
// one line saying where it is. With --stall_action=stop, node 0 then ends the job
// with the report as its root cause. Once the node stops its workers (a failure, a
// stop signal, another node's notice), nothing more is detected in that attempt: the
// waits of workers being stopped are no stall.
// When some of this node's workers are stopped (SIGSTOP, a tracer), the headline
// names them as the likely cause; other nodes' ranks are named by their own reports.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "diagnose/stall_report.hpp"
#include "job/attempt_watch.hpp"

namespace rdzv {
class TcpStore;
}

namespace ddprun {

enum class StallAction { Report, Stop };

// Five minutes: long enough for one rank's checkpoint or evaluation while the others
// wait in the next collective, and half of PyTorch's 10-minute NCCL watchdog, so the
// report comes before a watchdog would end the job without one.
inline constexpr double kDefaultStallTimeout = 300.0;

struct StallMonitorOptions {
  double timeout_s = kDefaultStallTimeout;  // 0: no stall detection
  StallAction action = StallAction::Report;
  std::string run_id;
  std::string hostname;  // (node rank and count come from each attempt's layout)
  std::chrono::milliseconds poll_interval{250};
  ProcessReportOptions process;
  // Where the report goes (ddprun: the console's stderr).
  std::function<void(const std::string&)> print;
  // The job's store (unprefixed: job keys), shared with the rest of the node; asked
  // for on the monitor's thread (it may wait for the node's link to connect).
  std::function<std::shared_ptr<rdzv::TcpStore>()> store;
};

class StallMonitor : public AttemptWatch {
 public:
  explicit StallMonitor(StallMonitorOptions options);
  ~StallMonitor() override;

  void started(int attempt, const JobLayout& layout, const std::vector<WorkerOutcome>& workers,
               std::function<void(const JobStop&)> stop_job) override;
  void stopping(int attempt) override;
  void ended(int attempt) override;

 private:
  void run();
  ProgressRecords read_records();
  // `what` says why ("a call failed"); `headline`, when not empty, replaces the analysis's.
  void report(const ProgressRecords& records, const std::string& what, const std::string& headline, uint64_t episode);
  std::string gather_other_nodes(uint64_t episode);
  std::vector<WorkerProcess> local_workers(const ProgressRecords& records) const;
  bool local_workers_alive() const;
  // The CPU time this node's workers used so far, or nothing unless every one is alive.
  std::optional<uint64_t> local_workers_cpu_ticks() const;
  bool sleep_for(std::chrono::milliseconds d);  // false when stopping

  StallMonitorOptions options_;
  // The running attempt (set before the thread starts, read only by it).
  int attempt_ = 0;
  JobLayout layout_;
  std::vector<WorkerProcess> workers_;
  std::function<void(const JobStop&)> stop_job_;
  std::vector<bool> present_;  // ranks whose record exists (records are never removed)
  std::atomic<bool> job_stopping_{false};  // the node stops this attempt's workers

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::shared_ptr<rdzv::TcpStore> store_;  // the monitor thread's, while it runs
  std::thread thread_;
};

}  // namespace ddprun
