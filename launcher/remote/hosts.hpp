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
// remote_options.hpp validates them (conflicts, DDPRUN_SSH, --ssh_args quoting).
struct RemoteOptions {
  std::optional<std::string> hostfile;       // --hostfile FILE: lines "host [slots=N]", '#' comments
  std::optional<std::string> hosts;          // --hosts h1:4,h2:4 (":N" optional)
  std::optional<std::string> include;        // --include h1:0,2@h2 (DeepSpeed's syntax)
  std::optional<std::string> exclude;        // --exclude h1:1@h3
  std::vector<std::string> ssh_command;      // DDPRUN_SSH's words (split as --ssh_args) or "ssh", then --ssh_args words
  std::optional<std::string> remote_ddprun;  // --remote_ddprun PATH (absolute); unset: this ddprun's own path
  std::vector<std::string> exports;          // each -x as given: "VAR" or "VAR=value"
  std::optional<std::string> env_file;       // --env_file FILE: "VAR=value" lines
  bool agent_stdin = false;                  // hidden --agent_stdin: this ddprun was started by a
                                             // launching ddprun; read AgentHandoff from stdin first

  bool launching() const { return hostfile.has_value() || hosts.has_value(); }
};

// One node of the job, in node-rank order.
struct HostEntry {
  std::string host;                         // as written (IPv6 without brackets), given to ssh
  std::optional<int> slots;                 // slots=N / h:N; unset: the node's --nproc_per_node decides
  std::optional<std::vector<int>> devices;  // GPU indices picked by --include/--exclude, ascending: that
                                            // node's CUDA_VISIBLE_DEVICES, and its worker count
};

// The job's hosts from --hostfile or --hosts, filtered by --include/--exclude.
//
// --hostfile: one host a line, as OpenMPI and DeepSpeed write them: "host slots=N".
//   Blank lines and '#' comments (whole-line or trailing) are skipped. "max_slots=M"
//   (OpenMPI) is accepted and has no effect: ddprun never oversubscribes. A line with
//   only a host leaves slots unset. slots=0 is an error (a node runs at least one
//   worker: leave the host out). Any other token is an error naming FILE:LINE.
// --hosts: "h1:4,h2,[::1]:2" (":N" optional; IPv6 addresses in brackets).
// A host is a name or an address, optionally user@host; it may not start with '-'
// (ssh would read it as an option). A host given twice is an error.
// --include/--exclude (DeepSpeed's syntax "h1:0,2@h2"; IPv6 hosts in brackets):
//   --include keeps only the hosts named, in the list's order (node ranks follow the
//   list, not the filter); a host named without indices keeps all of its GPUs, one
//   with indices keeps only those. --exclude drops a host named without indices, and
//   only the indices named otherwise (the host keeps the rest of 0..slots-1).
//   Errors: a host the list lacks, a host named twice in one filter, an index >= the
//   host's slots, --exclude of indices on a host without slots, a host left with no
//   GPU (exclude the host itself instead), no host left, and a numeric
//   --nproc_per_node that differs from the number of GPUs picked on a host.
// Throws UsageError (an unreadable file: LaunchError), one line naming what is wrong.
std::vector<HostEntry> resolve_hosts(const LaunchOptions& options);

// The --nproc_per_node value this host's agent is started with: the command line's
// --nproc_per_node when given, else the count of GPU indices --include/--exclude picked,
// else the host's slots, else "1". (A value like "gpu" is resolved on the host.)
std::string nproc_for(const HostEntry& host, const LaunchOptions& options);

// The host's CUDA_VISIBLE_DEVICES ("0,2") when --include/--exclude picked its GPUs;
// nothing when the host keeps whatever its environment has.
std::optional<std::string> cuda_visible_devices(const HostEntry& host);

// The variables every agent sets for itself and its workers, in the order sent:
//   1. the defaults from this process's environment, by name: NCCL_*, DDP_*, PYTHON*,
//      OMP_*, CUDA_* but CUDA_VISIBLE_DEVICES (each host's comes from its GPU picks),
//      PATH and LD_LIBRARY_PATH;
//   2. --env_file FILE: "VAR=value" a line; blank lines and lines starting with '#'
//      are skipped ('#' inside a value is kept); a leading "export " is allowed (files
//      written for a shell work); a value wrapped whole in '...' or "..." loses the
//      quotes and is taken literally (no escapes, no $expansion); an unquoted value
//      loses trailing blanks;
//   3. each -x: "VAR" (this environment's value; unset is an error) or "VAR=value".
// A later setting of a name replaces the earlier value in place (the name keeps its
// first position). DDPRUN_TOKEN is never sent: the token travels in the handoff.
// A bad name, a bad env file line or an unset -x VAR: UsageError naming it (FILE:LINE
// for the file); an unreadable env file: LaunchError.
std::vector<std::pair<std::string, std::string>> propagated_environment(const LaunchOptions& options);

// What ddprun -v prints on the launcher before starting the agents: each node's rank,
// host, worker count (and where it came from) and CUDA_VISIBLE_DEVICES, the agent
// command, and every variable sent as NAME=value (control characters escaped).
// Ends with a newline.
std::string describe_remote_plan(const std::vector<HostEntry>& hosts,
                                 const std::vector<std::pair<std::string, std::string>>& env,
                                 const LaunchOptions& options);

// The lines of the file a flag names (--hostfile, --env_file), '\r' of CRLF files
// removed. Throws LaunchError naming the flag, the file and why it cannot be read.
std::vector<std::string> read_flag_file(const std::string& flag, const std::string& path);

}  // namespace ddprun
