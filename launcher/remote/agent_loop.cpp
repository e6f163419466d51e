#include "remote/agent_loop.hpp"

#include <poll.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>

#include "remote/agent_handoff.hpp"
#include "job/attempt_result.hpp"
#include "supervise/console.hpp"
#include "errors.hpp"

namespace ddprun {
namespace {

constexpr int kLoopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};
// After a stop: how much longer than the grace period the agents get to stop their
// workers, publish and leave, before the launcher SIGKILLs them.
constexpr auto kStopMargin = std::chrono::seconds(10);
// After the first agent failed: how long its failure notice may take to reach the
// store (a will fires when the server sees the connection close).
constexpr auto kSettleTime = std::chrono::seconds(1);
// After SIGKILL, or after the last agent exited: how long to wait for exits and the
// last buffered output.
constexpr auto kDrainTime = std::chrono::seconds(3);
// While no agent failed: how often the launcher looks for a failure in its store.
constexpr auto kStoreReadInterval = std::chrono::seconds(1);
constexpr int kSshFailed = 255;  // ssh's own failure (cannot connect, key refused), and more

std::chrono::steady_clock::duration seconds_of(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// The signals the loop takes through its signalfd.
sigset_t loop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kLoopSignals) sigaddset(&set, sig);
  return set;
}

}  // namespace

void AgentLoop::block_signals() {
  const sigset_t set = loop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

AgentLoop::AgentLoop(std::vector<AgentLaunch> launches, AgentLoopOptions options)
    : launches_(std::move(launches)), options_(std::move(options)) {
  const sigset_t set = loop_signals();
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) throw LaunchError(std::string("cannot create a signalfd: ") + strerror(errno));
}

AgentLoop::~AgentLoop() {
  agents_.clear();  // SIGKILLs and reaps any agent still running
  if (signal_fd_ >= 0) close(signal_fd_);
}

int AgentLoop::run() {
  start_agents();
  while (true) {
    bool running = false;
    bool output = false;
    for (auto& a : agents_) {
      running = running || !a->exited();
      output = output || a->output_open();
    }
    if (!running && !give_up_at_) give_up_at_ = Clock::now() + kDrainTime;
    if (!running && !output) break;
    if (give_up_at_ && Clock::now() >= *give_up_at_) {
      if (running) spdlog::error("an agent did not exit after SIGKILL; giving up on it");
      break;
    }
    poll_once();
  }
  return outcome();
}

void AgentLoop::start_agents() {
  started_at_ = Clock::now();
  next_notice_ = started_at_ + options_.notice_every;
  for (size_t i = 0; i < launches_.size(); ++i) {
    try {
      agents_.push_back(std::make_unique<AgentProcess>(launches_[i]));
    } catch (const LaunchError& e) {
      launch_failure_ = e.what();
      stop_all(SIGTERM, seconds_of(options_.grace_period_s) + kStopMargin);
      return;
    }
  }
}

void AgentLoop::poll_once() {
  // The console's writers queue what the agents say; while they are far behind (a
  // console that stopped reading) the agents' output waits in the pipes instead.
  const bool read_output =
      Console::out().backlog() < Console::kHighWater && Console::err().backlog() < Console::kHighWater;
  std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
  std::vector<std::pair<size_t, int>> owner = {{SIZE_MAX, -1}};
  for (size_t i = 0; i < agents_.size(); ++i) {
    AgentProcess& a = *agents_[i];
    if (a.stdin_fd() >= 0) {
      fds.push_back({a.stdin_fd(), POLLOUT, 0});
      owner.emplace_back(i, a.stdin_fd());
    }
    for (int fd : {a.stdout_fd(), a.stderr_fd()}) {
      if (fd < 0 || !read_output) continue;
      fds.push_back({fd, POLLIN, 0});
      owner.emplace_back(i, fd);
    }
  }
  // Wake for the next timer; at least every 100 ms while output waits on the console.
  auto wait = std::chrono::milliseconds(read_output ? 1000 : 100);
  for (const auto& t : {settle_at_, kill_at_, give_up_at_}) {
    if (t) wait = std::min(wait, std::max(std::chrono::milliseconds(0),
                                          std::chrono::duration_cast<std::chrono::milliseconds>(*t - Clock::now())));
  }
  int ready = poll(fds.data(), fds.size(), static_cast<int>(wait.count()) + 1);
  if (ready < 0 && errno != EINTR) throw LaunchError(std::string("poll failed: ") + strerror(errno));
  for (size_t k = 1; ready > 0 && k < fds.size(); ++k) {
    if (fds[k].revents == 0) continue;
    AgentProcess& a = *agents_[owner[k].first];
    if (fds[k].events & POLLOUT) {
      a.on_writable();
    } else {
      a.on_readable(owner[k].second);
    }
  }
  if (ready > 0 && fds[0].revents != 0) {
    signalfd_siginfo info{};
    while (read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      if (info.ssi_signo != SIGCHLD) on_signal(static_cast<int>(info.ssi_signo));
    }
  }
  reap_all();  // SIGCHLD or not: cheap, and a merged SIGCHLD loses nothing
  on_timers();
}

void AgentLoop::on_signal(int sig) {
  // Every agent has ended (only their last output is still draining): nothing is left
  // to stop, and how the job ended stands.
  if (std::all_of(agents_.begin(), agents_.end(), [](const auto& a) { return a->exited(); })) {
    spdlog::info("received {} after every node ended; the job's status stands", signal_name(sig));
    return;
  }
  if (stop_signal_ == 0) {
    stop_signal_ = sig;
    spdlog::info("received {}; stopping every node (their workers get SIGKILL after the grace period of {} s; "
                 "a second {} kills them at once)",
                 signal_name(sig), options_.grace_period_s, signal_name(sig));
    stop_all(sig, seconds_of(options_.grace_period_s) + kStopMargin);
    // An agent that has not said it runs (ssh still connecting, or the remote ddprun not
    // yet past its handoff) reads no stop line and has no workers: its ssh ends now.
    for (auto& a : agents_) {
      if (a->exited() || a->started()) continue;
      spdlog::info("the agent on host {} (node {}) has not started yet; ending its {}", a->launch().host,
                   a->launch().node_rank, a->launch().over_ssh ? "ssh" : "process");
      a->kill_group(SIGTERM);
    }
  } else {
    spdlog::info("received {} again; every node kills its workers now", signal_name(sig));
    for (auto& a : agents_) a->send(stop_line(sig));
    kill_at_ = std::min(*kill_at_, Clock::now() + kStopMargin);
  }
}

void AgentLoop::stop_all(int sig, Clock::duration within) {
  for (auto& a : agents_) a->send(stop_line(sig));
  auto at = Clock::now() + within;
  kill_at_ = kill_at_ ? std::min(*kill_at_, at) : at;
}

void AgentLoop::reap_all() {
  for (size_t i = 0; i < agents_.size(); ++i) {
    if (!agents_[i]->exited() && agents_[i]->reap()) on_exit(i);
  }
}

void AgentLoop::on_exit(size_t index) {
  const AgentProcess& a = *agents_[index];
  if (a.status() == 0 || stop_signal_ != 0 || launch_failure_ || first_failed_) return;
  first_failed_ = index;
  // 255 is ssh's own failure only when the agent never ran: ssh also exits 255 when the
  // connection drops or the remote command dies of a signal, and an agent passes on a
  // worker's 255. Those go the usual way (with --master_addr: the status passes through).
  if (a.launch().over_ssh && a.status() == kSshFailed && !a.started() &&
      !options_.reader.joined(a.launch().node_rank)) {
    std::string said = a.last_error_line().empty() ? "it wrote nothing" : a.last_error_line();
    fail_launch(index, "ssh failed (exit status 255): " + said, kExitLaunch);
    return;
  }
  // A failure of the job ends every node by itself; give them time for it (a lost
  // node is noticed within the heartbeat timeout), then stop what is left.
  const auto at = Clock::now() + failure_deadline();
  kill_at_ = kill_at_ ? std::min(*kill_at_, at) : at;
  kill_for_attempt_.reset();
  if (options_.reader.enabled()) settle_at_ = Clock::now() + kSettleTime;
}

std::chrono::steady_clock::duration AgentLoop::failure_deadline() const {
  return seconds_of(options_.heartbeat_timeout_s + options_.grace_period_s) + kStopMargin;
}

void AgentLoop::watch_store(Clock::time_point now) {
  if (!options_.reader.enabled() || stop_signal_ != 0 || launch_failure_ || first_failed_) return;
  if (now < next_store_read_) return;
  next_store_read_ = now + kStoreReadInterval;
  const int attempt = options_.reader.latest_attempt();
  if (auto notice = options_.reader.latest_failure()) {
    if (kill_at_) return;
    kill_at_ = now + failure_deadline();
    kill_for_attempt_ = attempt;
    spdlog::info("the job failed ({}); waiting up to {:.0f} s for every node to end", notice->describe(),
                 std::chrono::duration<double>(failure_deadline()).count());
  } else if (kill_for_attempt_ && attempt > *kill_for_attempt_) {
    kill_at_.reset();  // the nodes restarted past that failure
    kill_for_attempt_.reset();
  }
}

void AgentLoop::fail_launch(size_t index, const std::string& why, int status) {
  const AgentProcess& a = *agents_[index];
  launch_failure_ = "cannot run the agent on host " + a.launch().host + " (node " +
                    std::to_string(a.launch().node_rank) + "): " + why;
  launch_failure_status_ = status;
  spdlog::error("{}; stopping the other nodes", *launch_failure_);
  stop_all(SIGTERM, seconds_of(options_.grace_period_s) + kStopMargin);
}

void AgentLoop::say_who_is_starting(Clock::time_point now) {
  if (options_.notice_every.count() <= 0 || stop_signal_ != 0 || now < next_notice_) return;
  while (next_notice_ <= now) next_notice_ += options_.notice_every;
  std::string hosts;
  for (const auto& a : agents_) {
    if (a->exited() || a->started()) continue;
    hosts += (hosts.empty() ? "" : ", ") + a->launch().host + " (node " + std::to_string(a->launch().node_rank) + ")";
  }
  if (hosts.empty()) return;
  spdlog::info("still waiting for the agent to start on {} ({:.0f} s; ssh gives up connecting after its "
               "ConnectTimeout)",
               hosts, std::chrono::duration<double>(now - started_at_).count());
}

void AgentLoop::on_timers() {
  const auto now = Clock::now();
  watch_store(now);
  say_who_is_starting(now);
  if (settle_at_ && now >= *settle_at_) {
    settle_at_.reset();
    // No failure in the store and that agent never joined: it ended on its own (it
    // could not start, or was killed before it joined); the others would wait out the
    // join timeout for it. One that joined is a lost node: its will reaches the store
    // within the heartbeat timeout, and the others end by themselves.
    const AgentProcess& a = *agents_[*first_failed_];
    if (!options_.reader.latest_failure() && !options_.reader.joined(a.launch().node_rank)) {
      fail_launch(*first_failed_, "it exited with status " + std::to_string(a.status()) +
                                      " before the job started or failed (its messages above say why)",
                  a.status());
    }
  }
  if (kill_at_ && now >= *kill_at_ && !killed_) {
    killed_ = true;
    for (auto& a : agents_) {
      if (a->exited()) continue;
      spdlog::error("the agent on host {} (node {}) did not end in time; killing it (its workers die with it)",
                    a->launch().host, a->launch().node_rank);
      a->kill_group(SIGKILL);
    }
    give_up_at_ = now + kDrainTime;
  }
  if (give_up_at_ && now >= *give_up_at_) {
    for (auto& a : agents_) {
      if (a->exited() && a->output_open()) a->close_output();
    }
  }
}

int AgentLoop::outcome() {
  if (stop_signal_ != 0) {
    spdlog::error("job {} stopped by {} sent to ddprun; every node was told to stop", options_.run_id,
                  signal_name(stop_signal_));
    return 128 + stop_signal_;
  }
  if (launch_failure_) {
    spdlog::error("job {} could not start: {}", options_.run_id, *launch_failure_);
    return launch_failure_status_;
  }
  // Every agent exited 0: the job succeeded, whatever an attempt it restarted past
  // left in the store.
  if (!first_failed_) return 0;
  if (auto notice = options_.reader.latest_failure()) {
    std::string host = notice->node >= 0 && static_cast<size_t>(notice->node) < launches_.size()
                           ? launches_[notice->node].host
                           : notice->host;
    spdlog::error("job {} failed on host {}: {}; exit status {}", options_.run_id, host, notice->describe(),
                  notice->status);
    return notice->status;
  }
  const AgentProcess& a = *agents_[*first_failed_];
  spdlog::error("job {} failed: the agent on host {} (node {}) exited with status {}", options_.run_id,
                a.launch().host, a.launch().node_rank, a.status());
  return a.status();
}

}  // namespace ddprun
