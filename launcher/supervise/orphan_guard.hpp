// The orphan guard: a small helper process that kills the workers' process groups
// if ddprun itself dies without cleaning up (SIGKILL, OOM killer, crash).
//
// PR_SET_PDEATHSIG only reaches each worker's leader; whatever the worker started
// (data loaders, shells, compilers) would live on. The guard is forked before the
// workers, sits in its own process group ignoring job-control signals, and reads
// the workers' group ids from a pipe. When the pipe hits end-of-file without a
// release, ddprun is gone: the guard SIGKILLs every group it was told about.
#pragma once

#include <sys/types.h>

namespace ddprun {

class OrphanGuard {
 public:
  // Forks the guard. Throws LaunchError when it cannot.
  OrphanGuard();
  // Releases the guard (it exits without killing anything).
  ~OrphanGuard();
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  // A worker's process group to kill if ddprun dies.
  void watch(pid_t pgid);
  // The group is gone (fully reaped): its id may be reused and must not be killed.
  void forget(pid_t pgid);

  pid_t pid() const { return pid_; }

 private:
  void send(int record);

  pid_t pid_ = -1;
  int fd_ = -1;  // write end of the pipe to the guard
};

}  // namespace ddprun
