// Host names for network-namespace hosts (netns.hpp), as pods and machines have them:
// each node runs under a host name of its own (a UTS namespace per command) and sees
// its own /etc/hosts (`ip netns exec NS` bind-mounts /etc/netns/NS/hosts over it when
// that file exists as the command starts). A hosts file is rewritten in place (same
// inode), so a command already running sees the change: a name that resolves only
// some seconds after the nodes started, as a Kubernetes headless Service's does.
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "netns.hpp"

namespace testing {

// One "address name..." line of a hosts file.
struct HostsEntry {
  std::string address;
  std::vector<std::string> names;
};

// The hosts files of a cluster's nodes: /etc/netns/<netns>/hosts, removed with this.
class NetnsHostsFiles {
 public:
  explicit NetnsHostsFiles(const NetnsCluster& cluster) : cluster_(cluster) {}
  ~NetnsHostsFiles() {
    std::error_code ec;
    for (const auto& dir : made_) std::filesystem::remove_all(dir, ec);
  }
  NetnsHostsFiles(const NetnsHostsFiles&) = delete;
  NetnsHostsFiles& operator=(const NetnsHostsFiles&) = delete;

  // Writes node i's hosts file: localhost, then `entries`. Before a command starts on
  // node i, this decides whether it gets the file at all; afterwards the command sees
  // each rewrite at its next lookup (the file is truncated and rewritten, never replaced).
  void write(int node, const std::vector<HostsEntry>& entries) {
    const std::filesystem::path dir = std::filesystem::path("/etc/netns") / cluster_.netns(node);
    if (!std::filesystem::exists(dir)) {
      std::filesystem::create_directories(dir);
      made_.push_back(dir);
    }
    std::string text = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n";
    for (const auto& e : entries) {
      text += e.address;
      for (const auto& n : e.names) text += " " + n;
      text += "\n";
    }
    std::ofstream out(dir / "hosts", std::ios::trunc);  // same inode when it exists
    out << text;
    out.close();
    if (!out) FAIL("cannot write " << (dir / "hosts").string());
  }

  // Every node's hosts file with the same entries.
  void write_all(const std::vector<HostsEntry>& entries, int nodes) {
    for (int i = 0; i < nodes; ++i) write(i, entries);
  }

 private:
  const NetnsCluster& cluster_;
  std::vector<std::filesystem::path> made_;
};

// argv that runs `command` on node i under the host name `hostname` (a UTS namespace
// of its own: gethostname() answers `hostname` there). The command keeps the pid the
// Process started (each step execs the next).
inline std::vector<std::string> on_named(const NetnsCluster& cluster, int node, const std::string& hostname,
                                         std::vector<std::string> command) {
  command.insert(command.begin(), {"unshare", "--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"", hostname});
  return cluster.on(node, std::move(command));
}

}  // namespace testing
