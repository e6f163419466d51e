#include "supervise/orphan_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>

#include "errors.hpp"
#include "supervise/signals_blocked.hpp"
#include "supervise/write_fully.hpp"

namespace ddprun {
namespace {

constexpr int kRelease = 0;  // record meaning "ddprun is exiting cleanly"

[[noreturn]] void guard_main(int read_fd) {
  setpgid(0, 0);  // out of ddprun's group: Ctrl-C and kill -PGID do not reach it
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) {
    sigaction(sig, &ignore, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Keep nothing of ddprun's open: its stdout must reach EOF when ddprun exits.
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd <= 2; ++fd) dup2(devnull, fd);
  dup2(read_fd, 3);
  close_range(4, ~0U, 0);

  std::set<pid_t> groups;
  int record = 0;
  while (true) {
    ssize_t n = read(3, &record, sizeof(record));
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof(record))) break;  // EOF: ddprun is gone
    if (record == kRelease) _exit(0);
    if (record > 0) {
      groups.insert(record);
    } else {
      groups.erase(-record);
    }
  }
  for (pid_t pgid : groups) kill(-pgid, SIGKILL);
  _exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw LaunchError(std::string("cannot create a pipe: ") + std::strerror(errno));
  pid_ = with_signals_blocked([&] {
    pid_t child = fork();
    if (child == 0) {
      close(fds[1]);
      guard_main(fds[0]);
    }
    return child;
  });
  int fork_errno = errno;
  close(fds[0]);
  if (pid_ < 0) {
    close(fds[1]);
    throw LaunchError(std::string("cannot start the orphan guard: fork failed: ") + std::strerror(fork_errno));
  }
  fd_ = fds[1];
}

OrphanGuard::~OrphanGuard() {
  if (fd_ >= 0) {
    send(kRelease);
    close(fd_);
  }
}

void OrphanGuard::watch(pid_t pgid) { send(pgid); }
void OrphanGuard::forget(pid_t pgid) { send(-pgid); }

void OrphanGuard::send(int record) {
  // 4 bytes into a pipe the guard drains: atomic, and it cannot fill up in practice.
  write_fully(fd_, std::string_view(reinterpret_cast<const char*>(&record), sizeof(record)));
}

}  // namespace ddprun
