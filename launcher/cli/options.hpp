// The ddprun command line: torchrun's flags (both `_` and `-` spellings) parsed
// into a validated LaunchOptions (launch_options.hpp). Values that need the machine
// (GPU count, free port, program lookup) are resolved later by prepare_launch()
// in plan/launch_plan.hpp.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "cli/launch_options.hpp"

namespace ddprun {

// What the command line asked for: a launch, or just help/version text (already printed).
struct ParsedCommandLine {
  std::optional<LaunchOptions> options;  // empty when --help or --version was handled
};

// "HOST:PORT" or "[IPv6]:PORT" of --rdzv_endpoint. Throws UsageError.
std::pair<std::string, int> parse_endpoint(const std::string& text);

// Parses argv. Prints --help/--version text to stdout and returns no options for them.
// Throws UsageError with a one-line message for anything invalid.
ParsedCommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace ddprun
