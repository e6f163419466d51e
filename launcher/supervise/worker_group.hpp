// One attempt's workers as the Supervisor (supervisor.hpp) runs them: starting them,
// their output streams, reaping, the root cause, stopping (SIGTERM, the grace period,
// SIGKILL) and the end of the attempt once every process is gone and every pipe is
// read to its end. Internal to supervise/: the Supervisor's io thread drives it.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "job/attempt_result.hpp"
#include "job/job_layout.hpp"
#include "plan/launch_plan.hpp"
#include "supervise/error_files.hpp"
#include "supervise/orphan_guard.hpp"
#include "supervise/output.hpp"

namespace ddprun {

// The signals that stop the job, and those only forwarded to the workers.
inline constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
inline constexpr int kForwardOnlySignals[] = {SIGUSR1, SIGUSR2};

inline bool is_stop_signal(int sig) {
  for (int s : kStopSignals) {
    if (s == sig) return true;
  }
  return false;
}

// A stop signal, or one --signals_to_handle names (torchrun stops its workers on each).
inline bool stops_job(int sig, const LaunchOptions& options) {
  for (int s : options.handled_signals) {
    if (s == sig) return true;
  }
  return is_stop_signal(sig);
}

// What a group uses of the Supervisor that runs it (all outlive the group).
struct GroupContext {
  const LaunchPlan& plan;
  boost::asio::io_context& io;  // the Supervisor's: every handler of the group runs on it
  OrphanGuard& guard;
  ErrorFiles& error_files;
};

class WorkerGroup {
 public:
  WorkerGroup(const GroupContext& context, int attempt, const JobLayout& layout, const AttemptHooks& hooks);
  ~WorkerGroup();

  void start();
  void reap();
  void resume_reading();  // the console caught up
  void on_signal(int sig);
  void on_remote_failure(RemoteCause cause);
  AttemptResult finish();
  bool done() const { return done_; }
  int attempt() const { return attempt_; }

 private:
  struct Stream {
    Stream(boost::asio::io_context& io, int fd, WorkerStream::Options opts) : descriptor(io, fd), sink(std::move(opts)) {}
    boost::asio::posix::stream_descriptor descriptor;
    WorkerStream sink;
    std::vector<char> buffer = std::vector<char>(64 * 1024);
  };
  struct Worker {
    WorkerOutcome outcome;
    bool group_gone = false;  // its process group is empty: its id may be reused, never signal it
    bool stop_told = false;   // its being stopped (continued, or held by a tracer) was logged
    std::unique_ptr<Stream> out;
    std::unique_ptr<Stream> err;
  };

  std::unique_ptr<Stream> open_stream(int read_fd, int local_rank, unsigned which);
  void read_some(Stream& s);
  void close_stream(Stream& s);
  void processes_gone();
  void maybe_complete();
  void begin_stop(int sig, const std::string& why);
  void signal_everything(int sig);
  void continue_stopped();
  void keep_continuing();
  std::vector<pid_t> stragglers() const;
  bool group_alive(Worker& w);
  void check_done();
  void on_grace_expired();
  void declare_root_cause();

  GroupContext ctx_;
  int attempt_;
  const JobLayout& layout_;
  const AttemptHooks& hooks_;
  std::optional<RemoteCause> remote_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Stream*> paused_;  // streams not read while the console is behind
  size_t running_ = 0;
  bool stopping_ = false;
  bool killed_ = false;   // SIGKILL sent
  size_t open_streams_ = 0;
  std::shared_ptr<FilteredLog> filtered_stdout_;  // --duplicate_stdout_filters' file, this attempt's
  std::shared_ptr<FilteredLog> filtered_stderr_;
  bool processes_gone_ = false;  // every worker and descendant reaped (or given up on)
  bool done_ = false;            // ...and every pipe read to the end: the attempt is over
  bool finished_ = false;  // finish() ran: outcomes handed out, nothing left to clean up
  std::optional<size_t> root_cause_;
  int stop_signal_ = 0;
  int stop_sent_ = 0;                     // the signal the stop sent (SIGTERM, forwarded, or SIGKILL)
  std::set<pid_t> signalled_stragglers_;  // so a re-parented process gets each signal once
  boost::asio::steady_timer grace_timer_;
  boost::asio::steady_timer drain_timer_;
  boost::asio::steady_timer continue_timer_;  // continues workers stopped again while stopping
  boost::asio::steady_timer hold_timer_;
  std::optional<size_t> held_failure_;  // the first failed worker, not yet declared the root cause
  bool hold_armed_ = false;             // waiting kStopSignalHold for ddprun's own stop signal
};

}  // namespace ddprun
