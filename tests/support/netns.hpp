// Real hosts for multi-node tests: network namespaces joined by veth pairs to a
// bridge that lives in a namespace of its own, so the machine's own network is
// never touched. Node i answers at 10.213.S.(i+1), where S is derived from this
// test process's pid so concurrent test runs do not collide. Needs root and iproute2.
// With NetnsOptions::second_interface every node also has eth1, on a second bridge
// and subnet (10.214.S.(i+1)): hosts with two networks, for choosing one.
#pragma once

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "subprocess.hpp"

namespace testing {

struct NetnsOptions {
  int nodes = 2;
  bool second_interface = false;  // eth1 on every node, on a bridge and subnet of its own
};

// Bytes an interface has sent and received (its kernel counters).
struct InterfaceBytes {
  long long tx = 0;
  long long rx = 0;
};

class NetnsCluster {
 public:
  explicit NetnsCluster(int nodes) : NetnsCluster(NetnsOptions{.nodes = nodes}) {}
  explicit NetnsCluster(const NetnsOptions& options) {
    if (geteuid() != 0) FAIL("multi-node tests need root to create network namespaces (CI runs as root)");
    try {
      build(options);
    } catch (...) {
      remove_all();
      throw;
    }
  }
  ~NetnsCluster() { remove_all(); }
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  std::string address(int node) const { return subnet_ + "." + std::to_string(node + 1); }
  // Node i's address on eth<iface> (1: the second interface, when there is one).
  std::string address(int node, int iface) const {
    return (iface == 0 ? subnet_ : subnet1_) + "." + std::to_string(node + 1);
  }

  // argv that runs `command` on node i.
  std::vector<std::string> on(int node, std::vector<std::string> command) const {
    command.insert(command.begin(), {"ip", "netns", "exec", namespaces_.at(node)});
    return command;
  }

  // The name of node i's network namespace (/run/netns/<name>).
  const std::string& netns(int node) const { return namespaces_.at(node); }

  // Cuts node i off the network (its link goes down; nothing is told).
  void cut(int node) { ip({"-n", namespaces_.at(node), "link", "set", "eth0", "down"}); }

  // What `device` on node i has sent and received so far (/sys/class/net/<device>/statistics,
  // as the node itself sees it).
  InterfaceBytes counters(int node, const std::string& device) const {
    auto read = [&](const std::string& which) {
      auto r = run(on(node, {"cat", "/sys/class/net/" + device + "/statistics/" + which}), {}, std::chrono::seconds(20));
      if (r.status != 0) FAIL("cannot read " << which << " of " << device << " on node " << node << ": " << r.err);
      return std::stoll(r.out);
    };
    return {read("tx_bytes"), read("rx_bytes")};
  }

 private:
  void build(const NetnsOptions& options) {
    const int nodes = options.nodes;
    int id = static_cast<int>(getpid() % 100000);
    subnet_ = "10.213." + std::to_string(getpid() % 250);
    subnet1_ = "10.214." + std::to_string(getpid() % 250);
    std::string prefix = "ddpt" + std::to_string(id);
    ip({"netns", "add", prefix + "-sw"});
    bridge_ns_ = prefix + "-sw";
    for (int k = 0; k < (options.second_interface ? 2 : 1); ++k) {
      const std::string bridge = "br" + std::to_string(k);
      ip({"-n", bridge_ns_, "link", "add", bridge, "type", "bridge"});
      ip({"-n", bridge_ns_, "link", "set", bridge, "up"});
    }
    for (int i = 0; i < nodes; ++i) {
      std::string ns = prefix + "-n" + std::to_string(i);
      ip({"netns", "add", ns});
      namespaces_.push_back(ns);
      const std::string pair = "dt" + std::to_string(id);
      link(ns, i, 0, pair + "a" + std::to_string(i), pair + "b" + std::to_string(i));
      ip({"-n", ns, "link", "set", "lo", "up"});
      if (options.second_interface) link(ns, i, 1, pair + "c" + std::to_string(i), pair + "d" + std::to_string(i));
    }
  }

  // eth<iface> of node i (namespace ns), through the veth pair a/b, on br<iface>.
  void link(const std::string& ns, int i, int iface, const std::string& a, const std::string& b) {
    const std::string dev = "eth" + std::to_string(iface);
    ip({"link", "add", a, "type", "veth", "peer", "name", b});
    ip({"link", "set", a, "netns", ns});
    ip({"link", "set", b, "netns", bridge_ns_});
    ip({"-n", ns, "link", "set", a, "name", dev});
    ip({"-n", ns, "addr", "add", address(i, iface) + "/24", "dev", dev});
    ip({"-n", ns, "link", "set", dev, "up"});
    ip({"-n", bridge_ns_, "link", "set", b, "master", "br" + std::to_string(iface)});
    ip({"-n", bridge_ns_, "link", "set", b, "up"});
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

  std::string subnet_, subnet1_, bridge_ns_;
  std::vector<std::string> namespaces_;
};

}  // namespace testing
