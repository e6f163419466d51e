// Real hosts for multi-node tests: network namespaces joined by veth pairs to a
// bridge that lives in a namespace of its own, so the machine's own network is
// never touched. Node i answers at 10.213.S.(i+1), where S is derived from this
// test process's pid so concurrent test runs do not collide. Needs root and iproute2.
#pragma once

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "subprocess.hpp"

namespace testing {

class NetnsCluster {
 public:
  explicit NetnsCluster(int nodes) {
    if (geteuid() != 0) FAIL("multi-node tests need root to create network namespaces (CI runs as root)");
    try {
      build(nodes);
    } catch (...) {
      remove_all();
      throw;
    }
  }
  ~NetnsCluster() { remove_all(); }
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  std::string address(int node) const { return subnet_ + "." + std::to_string(node + 1); }

  // argv that runs `command` on node i.
  std::vector<std::string> on(int node, std::vector<std::string> command) const {
    command.insert(command.begin(), {"ip", "netns", "exec", namespaces_.at(node)});
    return command;
  }

  // The name of node i's network namespace (/run/netns/<name>).
  const std::string& netns(int node) const { return namespaces_.at(node); }

  // Cuts node i off the network (its link goes down; nothing is told).
  void cut(int node) { ip({"-n", namespaces_.at(node), "link", "set", "eth0", "down"}); }

 private:
  void build(int nodes) {
    int id = static_cast<int>(getpid() % 100000);
    subnet_ = "10.213." + std::to_string(getpid() % 250);
    std::string prefix = "ddpt" + std::to_string(id);
    ip({"netns", "add", prefix + "-sw"});
    bridge_ns_ = prefix + "-sw";
    ip({"-n", bridge_ns_, "link", "add", "br0", "type", "bridge"});
    ip({"-n", bridge_ns_, "link", "set", "br0", "up"});
    for (int i = 0; i < nodes; ++i) {
      std::string ns = prefix + "-n" + std::to_string(i);
      std::string a = "dt" + std::to_string(id) + "a" + std::to_string(i);
      std::string b = "dt" + std::to_string(id) + "b" + std::to_string(i);
      ip({"netns", "add", ns});
      namespaces_.push_back(ns);
      ip({"link", "add", a, "type", "veth", "peer", "name", b});
      ip({"link", "set", a, "netns", ns});
      ip({"link", "set", b, "netns", bridge_ns_});
      ip({"-n", ns, "link", "set", a, "name", "eth0"});
      ip({"-n", ns, "addr", "add", address(i) + "/24", "dev", "eth0"});
      ip({"-n", ns, "link", "set", "eth0", "up"});
      ip({"-n", ns, "link", "set", "lo", "up"});
      ip({"-n", bridge_ns_, "link", "set", b, "master", "br0"});
      ip({"-n", bridge_ns_, "link", "set", b, "up"});
    }
  }

  void remove_all() {
    for (const auto& ns : namespaces_) run({"ip", "netns", "del", ns}, {}, std::chrono::seconds(20));
    if (!bridge_ns_.empty()) run({"ip", "netns", "del", bridge_ns_}, {}, std::chrono::seconds(20));
    namespaces_.clear();
    bridge_ns_.clear();
  }

  static void ip(std::vector<std::string> args) {
    args.insert(args.begin(), "ip");
    auto r = run(args, {}, std::chrono::seconds(20));
    if (r.status != 0) FAIL("setting up test hosts failed: " << Catch::rangeToString(args) << ": " << r.err);
  }

  std::string subnet_, bridge_ns_;
  std::vector<std::string> namespaces_;
};

}  // namespace testing
