// One attempt's workers (worker_group.hpp).
#include "supervise/worker_group.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "errors.hpp"
#include "supervise/line_prefix.hpp"
#include "supervise/console.hpp"
#include "supervise/process_state.hpp"
#include "supervise/spawn.hpp"
#include "supervise/worker_environment.hpp"

namespace ddprun {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

// After SIGKILL, how long to wait for the kernel to finish off processes (e.g. ones
// stuck in uninterruptible I/O) before giving up on reaping them.
constexpr auto kReapAfterKillTimeout = std::chrono::seconds(5);
// A worker killed by a stop signal (TERM, INT, HUP, QUIT) is often one of many
// processes a job scheduler is signalling at once (scancel signals the whole step);
// ddprun waits this long for its own copy before calling that worker the root cause.
constexpr auto kStopSignalHold = std::chrono::milliseconds(200);
// Once every process is gone, the pipes hold at most their last buffered bytes; a
// pipe still open after this long is held by something outside ddprun's reach.
constexpr auto kDrainTimeout = std::chrono::seconds(2);
// While stopping, how often workers are continued again: a SIGSTOP that comes after the
// first SIGCONT holds the stop no longer than this.
constexpr auto kContinueEvery = std::chrono::seconds(1);

// Direct children of this process (workers, orphans re-parented to ddprun as the
// subreaper, and the guard), from /proc/self/task/<tid>/children.
std::vector<pid_t> direct_children() {
  std::vector<pid_t> pids;
  std::ifstream in("/proc/self/task/" + std::to_string(getpid()) + "/children");
  pid_t pid;
  while (in >> pid) pids.push_back(pid);
  return pids;
}

// A pipe whose read end ddprun keeps; the write end goes to the worker.
struct Pipe {
  int read_fd = -1;
  int write_fd = -1;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw LaunchError(std::string("cannot create a pipe: ") + strerror(errno));
    read_fd = fds[0];
    write_fd = fds[1];
  }
};

}  // namespace

WorkerGroup::WorkerGroup(const GroupContext& context, int attempt, const JobLayout& layout,
                         const AttemptHooks& hooks)
    : ctx_(context),
      attempt_(attempt),
      layout_(layout),
      hooks_(hooks),
      grace_timer_(ctx_.io),
      drain_timer_(ctx_.io),
      continue_timer_(ctx_.io),
      hold_timer_(ctx_.io) {}

WorkerGroup::~WorkerGroup() {
  if (finished_) return;
  // Only reached with live workers when starting them failed part-way.
  for (auto& w : workers_) {
    if (!w->outcome.reaped) kill(-w->outcome.pid, SIGKILL);
  }
  for (auto& w : workers_) {
    if (!w->outcome.reaped) waitpid(w->outcome.pid, nullptr, 0);
    if (!w->group_gone) ctx_.guard.forget(w->outcome.pid);
    w->out->descriptor.cancel();
    w->err->descriptor.cancel();
  }
  // Run the aborted read handlers now, while the streams they refer to exist.
  ctx_.io.restart();
  ctx_.io.poll();
}

// While the leader is unreaped its pid (and group id) cannot be reused. After that the
// group lives as long as processes the worker started remain in it; once it is empty
// it is forgotten for good, here and in the orphan guard.
bool WorkerGroup::group_alive(Worker& w) {
  if (w.group_gone) return false;
  if (!w.outcome.reaped) return true;
  if (kill(-w.outcome.pid, 0) == 0 || errno == EPERM) return true;
  w.group_gone = true;
  ctx_.guard.forget(w.outcome.pid);
  return false;
}

std::unique_ptr<WorkerGroup::Stream> WorkerGroup::open_stream(int read_fd, int local_rank, unsigned which) {
  const LaunchPlan& plan = ctx_.plan;
  const LaunchOptions& o = plan.options;
  WorkerStream::Options opts;
  std::string rank = std::to_string(layout_.rank_offset + local_rank);
  LinePrefix prefix = line_prefix(o.log_line_prefix_template,
                                  {layout_.rank_offset + local_rank, local_rank, o.role, plan.hostname});
  opts.prefix = std::move(prefix.text);
  opts.skip_present_prefix = prefix.skip_when_present;
  opts.duplicate = which == kStdout ? filtered_stdout_ : filtered_stderr_;
  opts.filters = which == kStdout ? o.duplicate_stdout_filters : o.duplicate_stderr_filters;
  // --tee wins over --redirects: a teed stream is on the console as well.
  bool redirected = (o.redirects.for_rank(local_rank) & which) != 0 && (o.tee.for_rank(local_rank) & which) == 0;
  bool filtered_out = o.local_ranks_filter && o.local_ranks_filter->count(local_rank) == 0;
  opts.fallback = which == kStdout ? &Console::out() : &Console::err();
  opts.console = redirected || filtered_out ? nullptr : opts.fallback;
  opts.keep_tail = which == kStderr;
  if (plan.log_root) {
    auto path = worker_log_dir(plan, attempt_, local_rank) / (which == kStdout ? "stdout.log" : "stderr.log");
    opts.log_path = path.string();
    opts.label = "rank " + rank + (which == kStdout ? "'s stdout" : "'s stderr");
    opts.log_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (opts.log_fd < 0) {
      int err = errno;
      close(read_fd);
      throw LaunchError("cannot open log file '" + path.string() + "': " + strerror(err));
    }
  }
  return std::make_unique<Stream>(ctx_.io, read_fd, std::move(opts));
}

void WorkerGroup::start() {
  const LaunchPlan& plan = ctx_.plan;
  // First every pipe and log file, so nothing that can fail is left once workers run.
  std::vector<std::pair<int, int>> write_ends;  // stdout, stderr of each worker
  if (plan.log_root) {
    auto attempt_dir = worker_log_dir(plan, attempt_, 0).parent_path();
    const LaunchOptions& o = plan.options;
    if (!o.duplicate_stdout_filters.empty()) {
      filtered_stdout_ = std::make_shared<FilteredLog>((attempt_dir / "filtered_stdout.log").string());
    }
    if (!o.duplicate_stderr_filters.empty()) {
      filtered_stderr_ = std::make_shared<FilteredLog>((attempt_dir / "filtered_stderr.log").string());
    }
  }
  try {
    for (int lr = 0; lr < plan.nproc; ++lr) {
      auto w = std::make_unique<Worker>();
      w->outcome.local_rank = lr;
      w->outcome.rank = layout_.rank_offset + lr;
      if (plan.log_root) w->outcome.stderr_log = (worker_log_dir(plan, attempt_, lr) / "stderr.log").string();
      Pipe out;
      write_ends.emplace_back(out.write_fd, -1);
      w->out = open_stream(out.read_fd, lr, kStdout);
      Pipe err;
      write_ends.back().second = err.write_fd;
      w->err = open_stream(err.read_fd, lr, kStderr);
      workers_.push_back(std::move(w));
    }
  } catch (...) {
    for (auto [o, e] : write_ends) {
      close(o);
      if (e >= 0) close(e);
    }
    throw;
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = *workers_[i];
    w.outcome.error_file = ctx_.error_files.prepare(attempt_, w.outcome.local_rank);
    std::vector<std::string> env =
        worker_environment(plan, layout_, w.outcome.local_rank, w.outcome.error_file);
    SpawnRequest req{&plan.command, &env, write_ends[i].first, write_ends[i].second};
    if (!plan.numa.empty()) req.binding = &plan.numa[w.outcome.local_rank];
    pid_t pid = -1;
    try {
      pid = spawn_worker(req);
    } catch (...) {
      for (size_t j = i; j < write_ends.size(); ++j) {
        close(write_ends[j].first);
        close(write_ends[j].second);
      }
      workers_.resize(i);  // the destructor kills and reaps those already started
      throw;
    }
    close(write_ends[i].first);
    close(write_ends[i].second);
    w.outcome.pid = pid;
    ctx_.guard.watch(pid);
    read_some(*w.out);
    read_some(*w.err);
    open_streams_ += 2;
    ++running_;
  }
  if (hooks_.on_started) {
    std::vector<WorkerOutcome> started;
    for (auto& w : workers_) started.push_back(w->outcome);
    hooks_.on_started(started);
  }
}

void WorkerGroup::read_some(Stream& s) {
  s.descriptor.async_read_some(asio::buffer(s.buffer), [this, &s](const boost::system::error_code& ec, size_t n) {
    if (n > 0) s.sink.consume(std::string_view(s.buffer.data(), n));
    if (ec) {
      close_stream(s);  // end of file, or cancelled by the drain timeout
    } else if (Console::out().backlog() > Console::kHighWater || Console::err().backlog() > Console::kHighWater) {
      paused_.push_back(&s);  // the console is behind: leave the rest in the pipe for now
    } else {
      read_some(s);
    }
  });
}

void WorkerGroup::resume_reading() {
  std::vector<Stream*> paused;
  paused.swap(paused_);
  for (Stream* s : paused) read_some(*s);
}

void WorkerGroup::close_stream(Stream& s) {
  s.sink.finish();
  boost::system::error_code ignored;
  s.descriptor.close(ignored);
  --open_streams_;
  maybe_complete();
}

void WorkerGroup::reap() {
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    if (pid == ctx_.guard.pid()) {
      spdlog::warn("the orphan guard (pid {}) exited unexpectedly; workers are no longer protected if ddprun is killed",
                   pid);
      continue;
    }
    for (size_t i = 0; i < workers_.size(); ++i) {
      WorkerOutcome& o = workers_[i]->outcome;
      if (o.pid != pid) continue;
      o.reaped = true;
      o.wait_status = status;
      o.ended = std::chrono::system_clock::now();
      o.ended_after_stop = stopping_;
      --running_;
      group_alive(*workers_[i]);  // forget the group at once if the leader was its last member
      if (hooks_.on_worker_exit) hooks_.on_worker_exit(o);
      if (o.failed() && !root_cause_ && !stopping_) {
        if (!held_failure_) held_failure_ = i;  // the first failure stays the candidate
        bool by_stop_signal = WIFSIGNALED(o.wait_status) && is_stop_signal(WTERMSIG(o.wait_status));
        if (!by_stop_signal) {
          declare_root_cause();
        } else if (!hold_armed_) {
          hold_armed_ = true;
          hold_timer_.expires_after(kStopSignalHold);
          hold_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (ec) return;
            declare_root_cause();
            maybe_complete();  // the attempt may have been waiting for the hold only
          });
        }
      }
      break;
    }
    // Anything else is a descendant re-parented to ddprun (the subreaper): reaped, nothing more.
  }
  check_done();
}

// The first failed worker becomes the root cause, unless ddprun itself was told to
// stop in the meantime (then the stop signal is the cause).
void WorkerGroup::declare_root_cause() {
  hold_timer_.cancel();
  hold_armed_ = false;
  if (!held_failure_ || root_cause_ || stop_signal_ != 0 || remote_) return;
  root_cause_ = *held_failure_;
  const WorkerOutcome& o = workers_[*root_cause_]->outcome;
  begin_stop(SIGTERM, "rank " + std::to_string(o.rank) + " " + o.describe());
  if (hooks_.on_local_failure) hooks_.on_local_failure(o);
}

void WorkerGroup::begin_stop(int sig, const std::string& why) {
  if (!stopping_ && hooks_.on_stopping) hooks_.on_stopping();
  stopping_ = true;
  stop_sent_ = sig;
  double grace = ctx_.plan.options.grace_period;
  if (running_ > 0 || !stragglers().empty()) {
    spdlog::info("{}; sending {} to the remaining workers (SIGKILL after {} s)", why, signal_name(sig), grace);
  }
  signal_everything(sig);
  if (sig != SIGKILL) {
    continue_stopped();
    keep_continuing();
  }
  grace_timer_.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace)));
  grace_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) on_grace_expired();
  });
}

void WorkerGroup::signal_everything(int sig) {
  for (auto& w : workers_) {
    // The leader may be gone while processes it started still hold its group.
    if (!group_alive(*w)) continue;
    // A worker that has not reached setsid() yet has no group: signal it directly
    // (its signals are blocked until it resets them, so nothing is lost).
    if (kill(-w->outcome.pid, sig) != 0 && errno == ESRCH && !w->outcome.reaped) kill(w->outcome.pid, sig);
  }
  for (pid_t pid : stragglers()) {
    kill(pid, sig);
    signalled_stragglers_.insert(pid);
  }
}

// A stopped process keeps the stop signal pending and would hold the stop for the
// whole grace period: every group (and straggler) is continued, so the signal it was
// just sent is delivered. SIGCONT does nothing to a process that runs. A process
// stopped by a tracer stays stopped until the tracer lets go or SIGKILL comes. Each
// worker's being stopped is logged once.
void WorkerGroup::continue_stopped() {
  for (auto& w : workers_) {
    if (!group_alive(*w)) continue;
    const pid_t pid = w->outcome.pid;
    const char state = w->outcome.reaped ? 0 : process_state_letter(pid);
    bool continued = kill(-pid, SIGCONT) == 0;
    if (!continued && errno == ESRCH && !w->outcome.reaped) continued = kill(pid, SIGCONT) == 0;
    if (w->stop_told) continue;
    if (state == 'T' && continued) {
      spdlog::info("rank {} (pid {}) was stopped (SIGSTOP); continued it so it can terminate", w->outcome.rank, pid);
      w->stop_told = true;
    } else if (state == 't') {
      spdlog::info("rank {} (pid {}) is stopped by a tracer (a debugger); it ends on SIGKILL after the grace period "
                   "unless the tracer lets it go",
                   w->outcome.rank, pid);
      w->stop_told = true;
    }
  }
  for (pid_t pid : stragglers()) kill(pid, SIGCONT);
}

// Until the grace period is over or every process is gone, continues the workers again
// every kContinueEvery: a SIGSTOP that came after the first SIGCONT is undone too.
void WorkerGroup::keep_continuing() {
  continue_timer_.expires_after(kContinueEvery);
  continue_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || killed_ || processes_gone_) return;
    continue_stopped();
    keep_continuing();
  });
}

// Direct children that are neither running workers nor the guard: processes the
// workers started that outlived them and were re-parented to ddprun.
std::vector<pid_t> WorkerGroup::stragglers() const {
  std::vector<pid_t> out;
  for (pid_t pid : direct_children()) {
    if (pid == ctx_.guard.pid()) continue;
    bool is_worker = false;
    for (auto& w : workers_) is_worker = is_worker || (w->outcome.pid == pid && !w->outcome.reaped);
    if (!is_worker) out.push_back(pid);
  }
  return out;
}

void WorkerGroup::check_done() {
  if (running_ > 0 || processes_gone_) return;
  bool leftovers = !stragglers().empty();
  for (auto& w : workers_) leftovers = group_alive(*w) || leftovers;
  if (leftovers) {
    if (!stopping_) {
      begin_stop(SIGTERM, "all workers exited but processes they started are still running");
    } else {
      // Processes re-parented to ddprun since the stop began (their parent was a
      // worker that just died) get the same signal the rest got.
      for (pid_t pid : stragglers()) {
        if (signalled_stragglers_.insert(pid).second) kill(pid, stop_sent_);
      }
    }
    return;  // the next SIGCHLD (or the grace timer) brings us back
  }
  processes_gone();
}

// Every process is gone; what they wrote last may still sit in the pipes.
void WorkerGroup::processes_gone() {
  processes_gone_ = true;
  grace_timer_.cancel();
  continue_timer_.cancel();
  if (open_streams_ > 0) {
    drain_timer_.expires_after(kDrainTimeout);
    drain_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      std::vector<Stream*> paused;
      paused.swap(paused_);
      for (Stream* s : paused) close_stream(*s);  // no read pending: close it here
      for (auto& w : workers_) {
        for (Stream* s : {w->out.get(), w->err.get()}) {
          if (s->descriptor.is_open()) s->descriptor.cancel();  // its handler closes it
        }
      }
    });
  }
  maybe_complete();
}

void WorkerGroup::maybe_complete() {
  // A held failure is decided (root cause, or not) before the attempt ends.
  if (!processes_gone_ || open_streams_ > 0 || done_ || hold_armed_) return;
  done_ = true;
  drain_timer_.cancel();
  ctx_.io.stop();
}

void WorkerGroup::on_signal(int sig) {
  if (!stops_job(sig, ctx_.plan.options)) {
    spdlog::info("received {}; forwarding it to the workers", signal_name(sig));
    signal_everything(sig);
    return;
  }
  if (stop_signal_ == 0) stop_signal_ = sig;
  if (!stopping_) {
    begin_stop(sig, "received " + signal_name(sig));
  } else if (!killed_) {
    spdlog::info("received {} while stopping; killing the workers now", signal_name(sig));
    on_grace_expired();
  }
}

void WorkerGroup::on_remote_failure(RemoteCause cause) {
  if (stopping_ || done_) return;
  // A stall this node reported (it carries the report) did not happen elsewhere.
  std::string why = cause.kind == NoticeKind::kGrow ? "the job re-forms: " + cause.description
                    : (cause.report.empty() ? "the job failed elsewhere: " : "") + cause.description;
  remote_ = std::move(cause);
  begin_stop(SIGTERM, why);
}

void WorkerGroup::on_grace_expired() {
  if (killed_) {
    spdlog::error("{} worker process(es) did not exit {} s after SIGKILL; giving up on them", running_,
                  std::chrono::duration_cast<std::chrono::seconds>(kReapAfterKillTimeout).count());
    processes_gone();
    return;
  }
  killed_ = true;
  stop_sent_ = SIGKILL;
  spdlog::info("grace period over; sending SIGKILL to whatever is left");
  signal_everything(SIGKILL);
  grace_timer_.expires_after(kReapAfterKillTimeout);
  grace_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) on_grace_expired();
  });
}

AttemptResult WorkerGroup::finish() {
  // No handler of this group may outlive it (they would run in the next attempt).
  grace_timer_.cancel();
  drain_timer_.cancel();
  continue_timer_.cancel();
  hold_timer_.cancel();
  AttemptResult result;
  for (auto& w : workers_) {
    w->outcome.stderr_tail.assign(w->err->sink.tail().lines().begin(), w->err->sink.tail().lines().end());
    for (Stream* s : {w->out.get(), w->err.get()}) {
      if (s->sink.log_failure()) w->outcome.incomplete_logs.push_back(*s->sink.log_failure());
    }
    if (!w->group_gone) ctx_.guard.forget(w->outcome.pid);
  }
  // Let the handlers of the cancelled timers and signal wait run (as aborted) while
  // this group still exists.
  ctx_.io.restart();
  ctx_.io.poll();
  for (auto& w : workers_) result.workers.push_back(w->outcome);
  finished_ = true;
  result.root_cause = root_cause_;
  result.remote = remote_;
  result.stop_signal = stop_signal_;
  return result;
}

}  // namespace ddprun
