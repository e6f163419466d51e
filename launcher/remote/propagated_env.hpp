// The variables a launching ddprun (--hostfile/--hosts) sends every node's agent: the
// defaults from its own environment, --env_file and -x.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/launch_options.hpp"

namespace ddprun {

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

}  // namespace ddprun
