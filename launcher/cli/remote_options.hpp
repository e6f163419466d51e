// The flags of a launch from one command (--hostfile/--hosts), as LaunchOptions
// carries them. remote_flags.hpp validates them (conflicts, DDPRUN_SSH, --ssh_args
// quoting); remote/hosts.hpp says what the host list means.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddprun {

// Empty/false when ddprun runs as one node.
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

}  // namespace ddprun
