// Many nodes from one command (`ddprun --hostfile FILE` / `--hosts h1:4,h2:4`): the
// host list, its GPU picks, and what the launching ddprun sends each node's agent.
//
// The launching ddprun starts one ddprun agent per host (over ssh, or as a child when
// the host is this machine: remote_launch.hpp). Node ranks follow the list's order.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddprun {

struct LaunchOptions;

// The flags of a launch from one command. Empty/false when ddprun runs as one node.
struct RemoteOptions {
  std::optional<std::string> hostfile;       // --hostfile FILE: lines "host [slots=N]", '#' comments
  std::optional<std::string> hosts;          // --hosts h1:4,h2:4 (":N" optional)
  std::optional<std::string> include;        // --include h1:0,2@h2 (DeepSpeed's syntax)
  std::optional<std::string> exclude;        // --exclude h1:1@h3
  std::vector<std::string> ssh_command;      // DDPRUN_SSH (split on blanks) or "ssh", then --ssh_args words
  std::optional<std::string> remote_ddprun;  // --remote_ddprun PATH; unset: this ddprun's own path
  std::vector<std::string> exports;          // each -x as given: "VAR" or "VAR=value"
  std::optional<std::string> env_file;       // --env_file FILE: "VAR=value" lines
  bool agent_stdin = false;                  // hidden --agent_stdin: this ddprun was started by a
                                             // launching ddprun; read AgentHandoff from stdin first

  bool launching() const { return hostfile.has_value() || hosts.has_value(); }
};

// One node of the job, in node-rank order.
struct HostEntry {
  std::string host;                         // as written: a name or an address, given to ssh
  std::optional<int> slots;                 // slots=N / h:N; unset: the node's --nproc_per_node decides
  std::optional<std::vector<int>> devices;  // GPU indices picked by --include/--exclude: that node's
                                            // CUDA_VISIBLE_DEVICES, and its worker count
};

// The job's hosts from --hostfile or --hosts, filtered by --include/--exclude. A host
// given twice, a bad line, a host or index that --include/--exclude names but the list
// lacks, or no host left: UsageError (an unreadable file: LaunchError), naming file and line.
std::vector<HostEntry> resolve_hosts(const LaunchOptions& options);

// The --nproc_per_node value this host's agent is started with: the command line's
// --nproc_per_node when given, else the count of GPU indices --include/--exclude picked,
// else the host's slots, else "1". (A value like "gpu" is resolved on the host.)
std::string nproc_for(const HostEntry& host, const LaunchOptions& options);

// The variables every agent sets for itself and its workers, in the order sent: the
// defaults (NCCL_*, DDP_*, PYTHON*, OMP_*, CUDA_* but CUDA_VISIBLE_DEVICES, PATH,
// LD_LIBRARY_PATH) taken from this process's environment, then --env_file's lines,
// then each -x (a later one wins). A bad -x or env file line: UsageError.
std::vector<std::pair<std::string, std::string>> propagated_environment(const LaunchOptions& options);

}  // namespace ddprun
