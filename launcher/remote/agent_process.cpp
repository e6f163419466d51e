#include "remote/agent_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "errors.hpp"
#include "remote/agent_handoff.hpp"
#include "supervise/console.hpp"
#include "supervise/signals_blocked.hpp"

extern char** environ;

namespace ddprun {
namespace {

// The destructor's wait for an agent it SIGKILLed.
constexpr auto kReapAfterKill = std::chrono::milliseconds(1000);

// Runs in the child between fork and exec: plain system calls only.
[[noreturn]] void exec_agent(const AgentLaunch& launch, pid_t parent, char* const* argv, char* const* envp, int in,
                             int out, int err) {
  // Its own process group: the terminal's Ctrl-C reaches only the launcher, which
  // then stops every node in order.
  setpgid(0, 0);
  if (launch.over_ssh) {
    // A backstop for a launcher killed outright: ssh ends, and with its connection
    // the remote agent's stdin, which stops that node.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 || dup2(err, STDERR_FILENO) < 0) _exit(126);
  close_range(3, ~0U, 0);
  if (!launch.over_ssh && chdir(launch.cwd.c_str()) != 0) {
    const char* msg = "ddprun: cannot enter the launcher's working directory for a local agent\n";
    (void)!write(STDERR_FILENO, msg, std::strlen(msg));
    _exit(126);
  }
  execvpe(argv[0], argv, envp);
  int e = errno;
  const char* head = "ddprun: cannot execute ";
  const char* what = std::strerror(e);
  (void)!write(STDERR_FILENO, head, std::strlen(head));
  (void)!write(STDERR_FILENO, argv[0], std::strlen(argv[0]));
  (void)!write(STDERR_FILENO, ": ", 2);
  (void)!write(STDERR_FILENO, what, std::strlen(what));
  (void)!write(STDERR_FILENO, "\n", 1);
  _exit(e == ENOENT ? 127 : 126);
}

void make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) throw LaunchError(std::string("cannot create a pipe: ") + std::strerror(errno));
}

}  // namespace

AgentProcess::AgentProcess(AgentLaunch launch)
    : launch_(std::move(launch)),
      out_relay_([](std::string lines) { Console::out().write(std::move(lines)); }),
      err_relay_([](std::string lines) { Console::err().write(std::move(lines)); }) {
  out_relay_.hide_once(kAgentStartedLine);
  int in[2], out[2], err[2];
  make_pipe(in);
  make_pipe(out);
  make_pipe(err);
  std::vector<char*> argv;
  for (auto& a : launch_.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The launcher's environment without the store's token: the agent gets it on its
  // stdin, and no `ps e` of ssh may show it.
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "DDPRUN_TOKEN=", 13) != 0) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = with_signals_blocked([&] {
    pid_t child = fork();
    if (child == 0) exec_agent(launch_, parent, argv.data(), envp.data(), in[0], out[1], err[1]);
    return child;
  });
  const int fork_errno = errno;
  for (int fd : {in[0], out[1], err[1]}) close(fd);
  stdin_ = in[1];
  stdout_ = out[0];
  stderr_ = err[0];
  if (pid < 0) {
    for (int* fd : {&stdin_, &stdout_, &stderr_}) close_fd(*fd);
    throw LaunchError("cannot start the agent for host " + launch_.host + ": fork failed: " + std::strerror(fork_errno));
  }
  pid_ = pid;
  setpgid(pid_, pid_);  // also here: a signal to the group may come before the child ran
  for (int fd : {stdin_, stdout_, stderr_}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  pending_ = launch_.handoff;
  on_writable();
}

AgentProcess::~AgentProcess() {
  if (pid_ > 0 && !status_) {
    kill_group(SIGKILL);
    // Bounded: a process in uninterruptible sleep outlives SIGKILL for as long as its
    // I/O takes, and the loop may already have given up on it. Not reaped then: init
    // reaps it once the launcher is gone. (The pid is ours until reaped, so the pidfd
    // is surely this agent's.)
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      while (poll(&p, 1, static_cast<int>(kReapAfterKill.count())) < 0 && errno == EINTR) {
      }
      close(pidfd);
    }
    int st = 0;
    waitpid(pid_, &st, WNOHANG);
  }
  for (int* fd : {&stdin_, &stdout_, &stderr_}) close_fd(*fd);
}

void AgentProcess::close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

void AgentProcess::on_writable() {
  while (!pending_.empty() && stdin_ >= 0) {
    ssize_t n = write(stdin_, pending_.data(), pending_.size());
    if (n > 0) {
      pending_.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;  // the loop polls for room
    } else {
      pending_.clear();  // the agent is gone (EPIPE): its exit tells the rest
    }
  }
}

void AgentProcess::on_readable(int fd) {
  char buffer[16384];
  while (true) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      (fd == stdout_ ? out_relay_ : err_relay_).feed(std::string_view(buffer, static_cast<size_t>(n)));
      if (static_cast<size_t>(n) < sizeof(buffer)) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // End of the stream (or an error reading it): flush the partial line.
    if (fd == stdout_) {
      out_relay_.finish();
      close_fd(stdout_);
    } else {
      err_relay_.finish();
      close_fd(stderr_);
    }
    return;
  }
}

void AgentProcess::close_output() {
  out_relay_.finish();
  err_relay_.finish();
  close_fd(stdout_);
  close_fd(stderr_);
}

void AgentProcess::send(const std::string& line) {
  if (status_ || stdin_ < 0) return;
  pending_ += line;
  on_writable();
}

bool AgentProcess::reap() {
  if (status_) return true;
  int st = 0;
  pid_t got = waitpid(pid_, &st, WNOHANG);
  if (got != pid_) return false;
  status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  pending_.clear();
  close_fd(stdin_);
  return true;
}

void AgentProcess::kill_group(int sig) const {
  if (pid_ > 0 && !status_) kill(-pid_, sig);
}

}  // namespace ddprun
