// A throwaway Slurm cluster for tests, from Debian's slurm-wlm and munge: one
// slurmd per node, each node a host of its own (a NetnsCluster network namespace, plus
// UTS and mount namespaces: its own hostname and /etc/hosts), slurmctld on node 0, one
// munged for all.
// Config, state and logs live in a temporary folder; everything is stopped and
// removed when the object goes, also when a test fails. Needs root.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "netns.hpp"
#include "subprocess.hpp"

namespace testing {

struct SlurmClusterOptions {
  // SlurmdTimeout: how long until slurmctld declares a silent node DOWN (Slurm's
  // default is 300 s). Until then a step with a task on a failed node does not end.
  int slurmd_timeout_s = 300;
};

class SlurmCluster {
 public:
  explicit SlurmCluster(int nodes, SlurmClusterOptions options = {}) : nodes_(nodes), options_(options) {
    if (geteuid() != 0) FAIL("Slurm tests need root to start slurmctld/slurmd in namespaces (CI runs as root)");
    try {
      start();
    } catch (...) {
      stop();
      throw;
    }
  }
  ~SlurmCluster() { stop(); }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  std::string name(int node) const {
    std::string n = std::to_string(node);
    return n.insert(0, 1, 'n');  // (not "n" + ...: GCC 12 warns falsely on that form)
  }
  std::string address(int node) const { return network_->address(node); }
  // Fails node i as a host fails: its link goes down; its slurmd and tasks go silent.
  void cut(int node) { network_->cut(node); }
  const std::filesystem::path& dir() const { return dir_.path(); }

  // argv running `command` on node i (its namespaces), with SLURM_CONF set.
  std::vector<std::string> on(int node, std::vector<std::string> command) const {
    std::vector<std::string> argv = {"nsenter", "--target", std::to_string(hosts_.at(node)->pid()), "--net", "--uts",
                                     "--mount", "--", "env", "SLURM_CONF=" + conf_.string()};
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }

  // Runs a command on node 0 (where sbatch/srun/scancel talk to slurmctld).
  RunResult run_on_head(std::vector<std::string> command, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    return run(on(0, std::move(command)), {}, timeout);
  }

 private:
  static void must(const std::vector<std::string>& argv) {
    auto r = run(argv, {}, std::chrono::seconds(30));
    if (r.status != 0) FAIL("starting the Slurm cluster: " << Catch::rangeToString(argv) << " failed: " << r.err);
  }

  void start() {
    std::filesystem::create_directories(dir() / "state");
    for (int i = 0; i < nodes_; ++i) std::filesystem::create_directories(dir() / "spool" / name(i));
    start_munge();

    // One host per node on the test network: its own hostname and /etc/hosts too. It
    // enters the namespace with nsenter --net (not `ip netns exec`, which remounts /sys
    // without the cgroup hierarchy slurmd needs).
    network_ = std::make_unique<NetnsCluster>(nodes_);
    write_hosts_and_config();
    for (int i = 0; i < nodes_; ++i) {
      std::string script = "hostname " + name(i) + " && mount --bind " + (dir() / "hosts").string() +
                           " /etc/hosts && exec sleep 100000";
      hosts_.push_back(std::make_unique<Process>(std::vector<std::string>{
          "nsenter", "--net=/run/netns/" + network_->netns(i), "unshare", "--uts", "--mount", "--propagation",
          "private", "sh", "-c", script}));
    }
    for (int i = 0; i < nodes_; ++i) {
      bool ready = false;
      for (int t = 0; t < 200 && !ready; ++t) {
        ready = run(on(i, {"hostname"})).out == name(i) + "\n";
        if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!ready) FAIL("host " << name(i) << " did not come up");
    }
    must(on(0, {"slurmctld", "-f", conf_.string()}));
    for (int i = 0; i < nodes_; ++i) must(on(i, {"slurmd", "-N", name(i), "-f", conf_.string()}));
    // Wait for every node to be idle.
    for (int t = 0; t < 300; ++t) {
      auto r = run(on(0, {"sinfo", "-h", "-N", "-o", "%t"}));
      auto states = lines_of(r.out);
      if (static_cast<int>(states.size()) == nodes_ &&
          std::all_of(states.begin(), states.end(), [](const std::string& s) { return s == "idle"; })) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL("the Slurm nodes did not become idle; slurmctld log:\n" << read_file(dir() / "slurmctld.log"));
  }

  void write_hosts_and_config() {
    std::ofstream hosts(dir() / "hosts");
    hosts << "127.0.0.1 localhost\n";
    for (int i = 0; i < nodes_; ++i) hosts << address(i) << " " << name(i) << "\n";
    conf_ = dir() / "slurm.conf";
    std::ofstream c(conf_);
    const std::string d = dir().string();
    c << "ClusterName=ddpt\n"
      << "SlurmctldHost=n0(" << address(0) << ")\n"
      << "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
      << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nMpiDefault=none\n"
      << "ReturnToService=2\nKillWait=5\nSchedulerType=sched/backfill\n"
      << "SlurmdTimeout=" << options_.slurmd_timeout_s << "\n"
      << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
      << "StateSaveLocation=" << d << "/state\n"
      << "SlurmdSpoolDir=" << d << "/spool/%n\n"
      << "SlurmctldPidFile=" << d << "/slurmctld.pid\n"
      << "SlurmdPidFile=" << d << "/slurmd-%n.pid\n"
      << "SlurmctldLogFile=" << d << "/slurmctld.log\n"
      << "SlurmdLogFile=" << d << "/slurmd-%n.log\n";
    for (int i = 0; i < nodes_; ++i) {
      c << "NodeName=" << name(i) << " NodeAddr=" << address(i) << " CPUs=2 State=UNKNOWN\n";
    }
    c << "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
  }

  void start_munge() {
    if (run({"sh", "-c", "munge -n | unmunge"}).status == 0) return;  // one is running already
    if (!std::filesystem::exists("/etc/munge/munge.key")) {
      must({"sh", "-c", "dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null && "
                        "chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key"});
    }
    must({"sh", "-c", "mkdir -p /run/munge && chown munge:munge /run/munge"});
    must({"runuser", "-u", "munge", "--", "/usr/sbin/munged"});
    started_munge_ = true;
  }

  void kill_pidfile(const std::filesystem::path& pidfile) {
    std::ifstream in(pidfile);
    pid_t pid = 0;
    if (in >> pid && pid > 1) kill(pid, SIGKILL);
  }

  void stop() {
    if (!hosts_.empty()) run(on(0, {"scancel", "--full", "--quiet", "--user=root"}), {}, std::chrono::seconds(20));
    kill_pidfile(dir() / "slurmctld.pid");
    for (int i = 0; i < nodes_; ++i) kill_pidfile(dir() / ("slurmd-" + name(i) + ".pid"));
    hosts_.clear();  // kills the host processes; their UTS and mount namespaces go with them
    network_.reset();
    if (started_munge_) run({"sh", "-c", "pkill -x munged"}, {}, std::chrono::seconds(10));
    started_munge_ = false;
  }

  int nodes_;
  SlurmClusterOptions options_;
  TempDir dir_;
  std::unique_ptr<NetnsCluster> network_;
  std::filesystem::path conf_;
  std::vector<std::unique_ptr<Process>> hosts_;
  bool started_munge_ = false;
};

}  // namespace testing
