// The command line that starts one node's ddprun agent for a launching ddprun
// (--hostfile/--hosts): the node's own ddprun flags, rebuilt from the launcher's
// LaunchOptions, and the ssh command that runs them on another host.
//
// Only flags that mean something on a node are passed on; the launcher's own
// (--hostfile, --include, -x, --local_addr, ...) are not. Secrets never appear here:
// the store's token and the propagated variables go on the agent's stdin
// (agent_handoff.hpp).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/options.hpp"

namespace ddprun {

// Where one node finds the job's store and what it runs.
struct AgentPlace {
  int node_rank = 0;
  int nnodes = 1;
  std::string nproc_per_node = "1";  // nproc_for(host, options)
  std::string run_id;
  // Store at an address the launcher hosts (--rdzv_endpoint ADDR:PORT); unset: node 0
  // hosts it (--master_addr/--master_port from the options).
  std::optional<std::string> store_endpoint;
};

// ddprun's arguments (without argv[0]) for the agent of `place`: the per-node flags of
// `options`, then --agent_stdin, "--", PROGRAM, ARGS.
std::vector<std::string> agent_arguments(const LaunchOptions& options, const AgentPlace& place);

// "0,2,3": a list of numbers as flags and variables take it (--local_ranks_filter,
// CUDA_VISIBLE_DEVICES).
std::string join_numbers(const std::vector<int>& numbers);
std::string join_numbers(const std::set<int>& numbers);

// One word for a POSIX shell (or zsh): single-quoted unless it is made only of
// characters no shell treats specially and does not start with '=' ("'" becomes '\'').
std::string shell_quote(const std::string& word);

// What runs a remote agent: ssh_command (ssh, DDPRUN_SSH, --ssh_args), then our
// defaults (-T, BatchMode, ConnectTimeout, ServerAliveInterval/CountMax: ssh keeps the
// first value of an option, so the user's own -o wins), the host, and one shell
// command line "cd CWD && exec DDPRUN ARGS..." with every word quoted. The server
// alive probes end an ssh whose connection is cut within about the heartbeat timeout
// (TCP alone would notice after hours), so the launcher sees that node go.
struct SshCommand {
  std::vector<std::string> ssh_command;  // options.remote.ssh_command
  std::string host;
  std::string cwd;
  std::string ddprun;                    // the ddprun path on that host
  std::vector<std::string> arguments;    // agent_arguments()
  int connect_timeout_s = 10;
  double heartbeat_timeout_s = 10;       // the job's --heartbeat_timeout
};
std::vector<std::string> ssh_argv(const SshCommand& command);

}  // namespace ddprun
