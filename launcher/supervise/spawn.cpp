#include "supervise/spawn.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "errors.hpp"
#include "supervise/signals_blocked.hpp"

namespace ddprun {
namespace {

std::vector<char*> to_c_array(const std::vector<std::string>& items) {
  std::vector<char*> out;
  out.reserve(items.size() + 1);
  for (const auto& s : items) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

constexpr int kMpolPreferred = 1;  // MPOL_PREFERRED (linux/mempolicy.h)

void write_error(const char* head, const char* what) {
  (void)!write(STDERR_FILENO, head, std::strlen(head));
  (void)!write(STDERR_FILENO, what, std::strlen(what));
  (void)!write(STDERR_FILENO, "\n", 1);
}

// In the child: the binding's CPUs (a failure ends the worker) and preferred memory node
// (a preference: a kernel without NUMA support refusing it changes nothing).
void apply_binding(const WorkerBinding& b) {
  if (syscall(SYS_sched_setaffinity, 0, b.cpu_mask.size() * sizeof(unsigned long), b.cpu_mask.data()) != 0) {
    write_error("ddprun: cannot bind the worker to its --numa_binding CPUs: ", std::strerror(errno));
    _exit(126);
  }
  // maxnode counts one bit more than the mask holds (the kernel reads maxnode - 1 bits).
  (void)syscall(SYS_set_mempolicy, kMpolPreferred, b.node_mask.data(), b.node_mask.size() * 8 * sizeof(unsigned long) + 1);
}

// Runs in the child between fork and exec: only plain system calls, no allocation.
[[noreturn]] void exec_child(const SpawnRequest& req, pid_t parent, char* const* argv, char* const* envp) {
  // Its own session (and so process group): job-control signals from ddprun's terminal
  // do not reach it, and it cannot be stopped for reading a terminal it does not own.
  setsid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // ddprun died before the prctl took effect

  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // incl. SIGPIPE ddprun ignores
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  if (dup2(req.stdout_fd, STDOUT_FILENO) < 0 || dup2(req.stderr_fd, STDERR_FILENO) < 0) _exit(126);
  close_range(3, ~0U, 0);  // nothing ddprun inherited from its own parent leaks into workers
  if (req.binding != nullptr) apply_binding(*req.binding);
  execve(req.command->path.c_str(), argv, envp);

  int err = errno;
  const char* what = std::strerror(err);
  const char* head = "ddprun: cannot execute ";
  (void)!write(STDERR_FILENO, head, std::strlen(head));
  (void)!write(STDERR_FILENO, req.command->path.c_str(), req.command->path.size());
  (void)!write(STDERR_FILENO, ": ", 2);
  (void)!write(STDERR_FILENO, what, std::strlen(what));
  (void)!write(STDERR_FILENO, "\n", 1);
  _exit(err == ENOENT ? 127 : 126);
}

}  // namespace

pid_t spawn_worker(const SpawnRequest& req) {
  std::vector<char*> argv = to_c_array(req.command->argv);
  std::vector<char*> envp = to_c_array(*req.environment);
  pid_t parent = getpid();
  pid_t pid = with_signals_blocked([&] {
    pid_t child = fork();
    if (child == 0) exec_child(req, parent, argv.data(), envp.data());
    return child;
  });
  if (pid < 0) throw LaunchError(std::string("cannot start a worker: fork failed: ") + std::strerror(errno));
  return pid;
}

}  // namespace ddprun
