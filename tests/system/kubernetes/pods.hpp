// Kubernetes pods without Kubernetes: each pod is a network-namespace host
// (tests/support/netns.hpp, netns_names.hpp) with what a container sees of its pod:
//  - its own host name (the pod's hostname), set in a UTS namespace of its own;
//  - a hosts file, /etc/netns/<namespace>/hosts, which `ip netns exec` mounts on
//    /etc/hosts: what the cluster DNS answers. A name can be published later (a
//    headless Service lists a pod only once it has an address): the file is
//    rewritten in place, so a pod already running sees it at its next lookup;
//  - exactly the environment its controller puts in the container spec, and none of
//    the test's own launcher variables;
//  - a command as a container's would be: `ddprun PROGRAM ARGS`, no other flags.
// Needs root (network namespaces, /etc/netns) and util-linux's unshare.
#pragma once

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "e2e.hpp"
#include "netns.hpp"
#include "netns_names.hpp"

namespace k8s {

using Env = std::map<std::string, std::string>;

// One pod of a pod set: its name (also its host name) and its container's environment.
struct PodSpec {
  std::string name;
  Env env;
};

// A name the cluster DNS answers for a pod, and whether it answers from the start.
struct ServiceName {
  std::string name;
  int pod = 0;
  bool later = false;  // published only by Pods::publish()
};

// Variables of the test's own environment a container would not have: a launcher's
// flags (torchrun's PET_ defaults, Slurm's step) and a worker's rank variables.
inline std::vector<std::string> foreign_variables() {
  std::vector<std::string> names = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                                    "DDPRUN_TOKEN", "TORCHELASTIC_RUN_ID"};
  for (char** e = environ; *e != nullptr; ++e) {
    std::string name(*e, std::strchr(*e, '=') ? std::strchr(*e, '=') - *e : std::strlen(*e));
    if (name.rfind("PET_", 0) == 0 || name.rfind("SLURM_", 0) == 0 || name.rfind("DDPRUN_", 0) == 0) {
      names.push_back(name);
    }
  }
  return names;
}

class Pods {
 public:
  Pods(std::vector<PodSpec> pods, std::vector<ServiceName> names)
      : specs_(std::move(pods)), names_(std::move(names)), cluster_(static_cast<int>(specs_.size())) {
    write_hosts_files();
  }
  Pods(const Pods&) = delete;
  Pods& operator=(const Pods&) = delete;

  int size() const { return static_cast<int>(specs_.size()); }
  const PodSpec& spec(int pod) const { return specs_.at(pod); }
  std::string address(int pod) const { return cluster_.address(pod); }

  // Publishes every name marked `later` in every pod's hosts file, in place (the file
  // is bind-mounted into running pods).
  void publish() {
    published_ = true;
    write_hosts_files();
  }

  // Starts pod `pod`'s container: `ddprun program...` in the pod. A pod started again
  // (a restarted container) keeps its name, address and hosts file; the earlier
  // process is kept for its output. Returns the container's index for container().
  size_t start(int pod, const std::vector<std::string>& program) {
    std::vector<std::string> command = {e2e::kDdprun};
    command.insert(command.end(), program.begin(), program.end());
    testing::ProcessOptions o;
    o.set_env = specs_.at(pod).env;
    for (const auto& name : foreign_variables()) {
      if (!o.set_env.count(name)) o.unset_env.push_back(name);
    }
    nodes_.push_back(
        std::make_unique<testing::Process>(testing::on_named(cluster_, pod, specs_.at(pod).name, command), o));
    pod_of_.push_back(pod);
    return nodes_.size() - 1;
  }

  testing::Process& container(size_t i) { return *nodes_.at(i); }
  size_t containers() const { return nodes_.size(); }

  // Everything every container wrote, for a failing check's message.
  std::string transcript() const {
    std::string t;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const std::string head = "---- " + specs_.at(pod_of_[i]).name + " (container " + std::to_string(i) + ")";
      t += head + " stdout:\n" + nodes_[i]->out() + head + " stderr:\n" + nodes_[i]->err();
    }
    return t;
  }

 private:
  // Each pod's hosts file: the kubelet's line for the pod itself, then the names the
  // cluster DNS answers now.
  void write_hosts_files() {
    for (int p = 0; p < size(); ++p) {
      std::vector<testing::HostsEntry> entries = {{cluster_.address(p), {specs_[p].name}}};
      for (const auto& n : names_) {
        if (!n.later || published_) entries.push_back({cluster_.address(n.pod), {n.name}});
      }
      hosts_.write(p, entries);
    }
  }

  std::vector<PodSpec> specs_;
  std::vector<ServiceName> names_;
  bool published_ = false;
  testing::NetnsCluster cluster_;
  testing::NetnsHostsFiles hosts_{cluster_};
  // Last: the containers end (SIGKILL) before the hosts files and namespaces go.
  std::vector<std::unique_ptr<testing::Process>> nodes_;
  std::vector<int> pod_of_;
};

}  // namespace k8s
