#include "remote/launcher_link.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "remote/agent_handoff.hpp"
#include "supervise/console.hpp"
#include "errors.hpp"
#include "plan/local_host.hpp"

namespace ddprun {
namespace {

constexpr auto kHandoffTimeout = std::chrono::seconds(30);
// Once the launcher is gone, this ddprun exits outright this long before the heartbeat
// timeout, whatever it is still waiting for (its store went with the launcher, so
// publishing and leaving only time out): the promise is that nothing of the node is
// left within the heartbeat timeout.
constexpr double kExitBeforeHeartbeatS = 1.0;
constexpr size_t kMaxControlLine = 256;

std::atomic<bool> launcher_stopped{false};  // a stop line came: the launcher speaks for the job
std::atomic<bool> link_lost{false};         // the link ended with no stop line before it
int link_fd = -1;                           // the launcher's pipe, once off fd 0

void watch_launcher(int fd, double grace_period_s, double heartbeat_timeout_s) {
  // Signals are for the threads that handle them, not this one.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  std::string line;
  char c;
  while (true) {
    ssize_t n = read(fd, &c, 1);  // blocks until a line or the end: nothing else to do
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (c != '\n') {
      if (line.size() < kMaxControlLine) line += c;
      continue;
    }
    if (auto sig = parse_stop_line(line)) {
      launcher_stopped = true;
      kill(getpid(), *sig);
    } else {
      spdlog::warn("ignoring an unknown control line from the launching ddprun");
    }
    line.clear();
  }
  spdlog::warn("lost the connection to the launching ddprun (it is gone, or its ssh connection was cut); "
               "stopping this node's workers");
  // A stop the launcher asked for stays that stop; otherwise this node is lost to the job.
  link_lost = !launcher_stopped;
  kill(getpid(), SIGTERM);
  // heartbeat_timeout_s >= 2 (the parser's floor), so cap <= exit_at.
  const double cap = std::min(grace_period_s, heartbeat_timeout_s / 2);
  const double exit_at = heartbeat_timeout_s - kExitBeforeHeartbeatS;
  std::this_thread::sleep_for(std::chrono::duration<double>(cap));
  kill(getpid(), SIGTERM);  // a stop signal while stopping: SIGKILL to the workers now
  std::this_thread::sleep_for(std::chrono::duration<double>(exit_at - cap));
  // Workers still running die with this process (PR_SET_PDEATHSIG, the orphan guard).
  _exit(link_lost ? 1 : 128 + SIGTERM);
}

}  // namespace

void join_launcher(LaunchOptions& options) {
  AgentHandoff handoff = read_handoff(STDIN_FILENO, kHandoffTimeout);
  for (const auto& [name, value] : handoff.env) {
    if (setenv(name.c_str(), value.c_str(), 1) != 0) {
      throw LaunchError("cannot set " + name + " from the launching ddprun: " + std::strerror(errno));
    }
  }
  options.token = handoff.token;
  // Before anything else goes to stdout: the launcher learns this agent runs.
  Console::out().write(std::string(kAgentStartedLine) + "\n");
  int link = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (link < 0 || null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0) {
    throw LaunchError(std::string("cannot move the launcher's pipe off standard input: ") + std::strerror(errno));
  }
  close(null_fd);
  link_fd = link;
  // Every line this agent logs names its host: the launcher's console mixes all nodes.
  spdlog::default_logger()->set_pattern("ddprun[" + local_hostname() + "]: %l: %v");
}

void watch_launcher_link(const LaunchOptions& options) {
  if (link_fd < 0) return;
  std::thread(watch_launcher, link_fd, options.grace_period, options.heartbeat_timeout).detach();
  link_fd = -1;
}

bool launcher_lost() { return link_lost; }

bool agent_wants_summary(const AttemptResult& result) {
  if (result.remote) return false;                             // the root cause's node prints it
  if (result.stop_signal != 0 && !result.root_cause) return !launcher_stopped;  // the launcher says it
  return true;
}

}  // namespace ddprun
