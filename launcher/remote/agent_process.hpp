// One node's agent as the launching ddprun sees it: a child process (ssh, or ddprun
// itself for this machine) in its own process group, with three pipes. Its stdin
// carries the handoff, then stop lines, and stays open until the agent ends: its end
// is how the agent learns that the launcher is gone. Its stdout and stderr are relayed
// to the launcher's console as whole lines.
//
// Not thread-safe: the launcher's one loop (remote_launch.cpp) polls the fds this
// exposes and calls back in on readiness.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "remote/line_relay.hpp"

namespace ddprun {

struct AgentLaunch {
  std::string host;                // as in the host list
  int node_rank = 0;
  bool over_ssh = false;           // ssh (dies with the launcher: PR_SET_PDEATHSIG) or a local ddprun
  std::vector<std::string> argv;   // argv[0] is looked up in PATH (as execvp does)
  std::string cwd;                 // a local agent runs here (an ssh command carries its own cd)
  std::string handoff;             // encode_handoff(): the first bytes on its stdin
};

class AgentProcess {
 public:
  // Starts the agent. Throws LaunchError when it cannot (fork or pipe failure); a
  // program that cannot be executed shows as exit status 127 with one line on stderr.
  explicit AgentProcess(AgentLaunch launch);
  // SIGKILLs its process group if it still runs, reaps it (waiting 1 s at most: one
  // that outlives SIGKILL is left to init), closes the pipes.
  ~AgentProcess();
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  const AgentLaunch& launch() const { return launch_; }
  pid_t pid() const { return pid_; }

  // The fds to poll: stdin while bytes wait to be written (POLLOUT), stdout and stderr
  // until they end (POLLIN). -1 when there is nothing to poll.
  int stdin_fd() const { return pending_.empty() ? -1 : stdin_; }
  int stdout_fd() const { return stdout_; }
  int stderr_fd() const { return stderr_; }
  void on_writable();
  void on_readable(int fd);  // relays what arrived; closes the fd at its end

  // Queues a control line (stop_line()) for its stdin; dropped once the agent is gone.
  void send(const std::string& line);

  // Reaps the agent if it has exited; true once it has.
  bool reap();
  bool exited() const { return status_.has_value(); }
  // Its exit code, or 128+signal.
  int status() const { return status_.value_or(-1); }
  bool output_open() const { return stdout_ >= 0 || stderr_ >= 0; }
  // Stops waiting for output that does not end (held by something the agent left).
  void close_output();

  // Signals its whole process group (ssh or the agent, and anything in its group).
  void kill_group(int sig) const;

  // Whether the agent said it runs (kAgentStartedLine: it read its handoff, so ssh
  // connected and ddprun started there).
  bool started() const { return out_relay_.hidden_seen(); }

  // The last line it wrote to stderr (ssh's own error, when ssh failed).
  const std::string& last_error_line() const { return err_relay_.last_line(); }

 private:
  void close_fd(int& fd);

  AgentLaunch launch_;
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  int stderr_ = -1;
  std::string pending_;  // bytes for its stdin not yet written
  std::optional<int> status_;
  LineRelay out_relay_;
  LineRelay err_relay_;
};

}  // namespace ddprun
