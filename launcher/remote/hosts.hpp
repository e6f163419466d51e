// Many nodes from one command (`ddprun --hostfile FILE` / `--hosts h1:4,h2:4`): the
// host list and its GPU picks. What the launching ddprun sends each node's agent is
// propagated_env.hpp; what -v prints of it all, remote_plan.hpp.
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

// The lines of the file a flag names (--hostfile, --env_file), '\r' of CRLF files
// removed. Throws LaunchError naming the flag, the file and why it cannot be read.
std::vector<std::string> read_flag_file(const std::string& flag, const std::string& path);

}  // namespace ddprun
