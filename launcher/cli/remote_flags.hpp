// Validation of the flags of a launch from one command (--hostfile/--hosts and the
// flags that only a launching ddprun uses), and of --local_addr. parse_command_line
// (options.hpp) calls it; what the flags mean is in remote/hosts.hpp.
#pragma once

#include <string>
#include <vector>

#include "cli/launch_options.hpp"

namespace ddprun {

// The flags as read from the command line (empty: not given).
struct RemoteFlags {
  std::string hostfile;
  std::string hosts;
  std::string include;
  std::string exclude;
  std::string ssh_args;
  std::string remote_ddprun;
  std::vector<std::string> exports;  // each -x
  std::string env_file;
  std::string local_addr;
};

// Which flags of a one-node launch were given: a launching ddprun refuses them, since
// it decides them for every node itself.
struct NodeFlagsGiven {
  bool nnodes = false;
  bool node_rank = false;
  bool rdzv_endpoint = false;
  bool standalone = false;  // --standalone or --rdzv_endpoint=HOST:0
};

// Fills options.remote and options.local_addr from `raw`. When launching, also the ssh
// command: DDPRUN_SSH's words (or "ssh"), then --ssh_args' words. Throws UsageError
// (one line, saying what to do instead) for: --hostfile with --hosts, --include with
// --exclude, a launcher-only flag without a host list, --nnodes/--node_rank/
// --rdzv_endpoint/--standalone/--agent_stdin with a host list, an empty DDPRUN_SSH,
// unbalanced quotes in --ssh_args, a relative --remote_ddprun, a --local_addr with blanks.
void apply_remote_flags(const RemoteFlags& raw, const NodeFlagsGiven& given, LaunchOptions& options);

// The words of --ssh_args as a POSIX shell splits them, without expansions: blanks
// separate words; '...' is literal; inside "..." a backslash escapes '"' and '\';
// outside quotes a backslash escapes the next character. Throws UsageError for an
// unterminated quote or a trailing backslash.
std::vector<std::string> split_shell_words(const std::string& flag, const std::string& text);

}  // namespace ddprun
