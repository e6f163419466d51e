// Real ssh hosts for the tests of `ddprun --hostfile`: a NetnsCluster whose first
// `hosts` namespaces each run Debian's /usr/sbin/sshd on their own address, plus one
// more namespace, the "login node", that runs no sshd and is where the launcher runs.
//
// Everything ssh needs is made by the fixture in a temporary folder: one host key per
// host, a client key authorized on every host, a known-hosts file with the hosts' keys,
// one sshd_config per host. Nothing in the real ~/.ssh or /etc/ssh is read or written
// (the client gets -F none). The client side reaches ddprun as DDPRUN_SSH
// (ssh_command()). All namespaces share the filesystem and the pid space, so the same
// ddprun path and working directory exist on every host.
//
// Teardown kills every process left in the namespaces (sshd, its sessions, anything a
// job left behind), then removes the namespaces and the folder, also when a test fails.
// Needs root.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "netns.hpp"
#include "subprocess.hpp"

namespace testing {

class SshHosts {
 public:
  // Starts `hosts` sshd hosts and the login node; returns once every sshd accepts a
  // login from the login node with the test key (FAILs the test after a bounded wait).
  explicit SshHosts(int hosts);
  ~SshHosts();
  SshHosts(const SshHosts&) = delete;
  SshHosts& operator=(const SshHosts&) = delete;

  int hosts() const { return hosts_; }
  // Host i's address (where its sshd listens).
  std::string address(int host) const { return cluster_->address(host); }
  // The login node's address.
  std::string login_address() const { return cluster_->address(hosts_); }
  // An address on the hosts' network where no machine answers at all (connects to it
  // time out: nothing replies to ARP).
  std::string unreachable_address() const;
  const std::filesystem::path& dir() const { return dir_.path(); }

  // argv that runs `command` on host i / on the login node.
  std::vector<std::string> on(int host, std::vector<std::string> command) const {
    return cluster_->on(host, std::move(command));
  }
  std::vector<std::string> on_login(std::vector<std::string> command) const {
    return cluster_->on(hosts_, std::move(command));
  }

  // The ssh client command with the test key and known hosts, words separated by
  // blanks (DDPRUN_SSH's form; the paths have no blanks).
  std::string ssh_command() const;
  // The same, word by word (for running ssh directly).
  std::vector<std::string> ssh_argv() const;
  // {"DDPRUN_SSH": ssh_command()}, for ProcessOptions::set_env.
  std::map<std::string, std::string> ssh_env() const { return {{"DDPRUN_SSH", ssh_command()}}; }

  // Live processes on host i (0..hosts()-1) or on the login node (hosts()), other than
  // that host's sshd listener. Zombies are not counted.
  std::vector<pid_t> processes_on(int host) const;
  // The same, on every host and the login node together.
  std::vector<pid_t> job_processes() const;
  // Waits until job_processes() is empty; returns the seconds it took, or nothing if
  // some process outlived `limit`.
  std::optional<double> wait_no_job_processes(std::chrono::milliseconds limit) const;
  // "pid comm args" for each of these pids, one a line (for a failing check's message).
  static std::string describe(const std::vector<pid_t>& pids);

  // The network namespace (its inode) that process `pid` is in; 0 once it is gone.
  static ino_t net_namespace_of(pid_t pid);
  // Host i's network namespace inode (the login node is hosts()).
  ino_t net_namespace(int host) const { return net_inodes_.at(static_cast<size_t>(host)); }

 private:
  void make_keys();
  void start_sshd(int host);
  void wait_accepting(int host);
  void kill_everything();

  int hosts_;
  TempDir dir_;
  std::unique_ptr<NetnsCluster> cluster_;
  std::vector<ino_t> net_inodes_;  // hosts then the login node
  std::vector<std::unique_ptr<Process>> sshd_;
};

}  // namespace testing
