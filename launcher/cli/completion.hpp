// `ddprun --print-completion SHELL` (torchrun's --print-completion): a completion script
// for bash, zsh or tcsh, made from the command line's own options so it never falls
// behind them.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace ddprun {

inline const std::vector<std::string> kCompletionShells = {"bash", "zsh", "tcsh"};

// The script for `shell` (one of kCompletionShells): ddprun's options (every spelling,
// with the values of those that take a fixed set), `status` and its options, and the
// program with its arguments completed as a command of their own.
std::string completion_script(const CLI::App& app, const std::string& shell);

}  // namespace ddprun
