// What a launching ddprun (--hostfile/--hosts) hands each node's agent on the agent's
// standard input, so secrets never appear on a command line or in an environment that
// `ps` shows: the store's token and the variables to propagate. After the handoff the
// same pipe carries control lines from the launcher, and its end (EOF) means the
// launcher is gone.
//
// Wire format (text, one item a line, values escaped so a line never holds a newline):
//   ddprun-handoff 1
//   token <escaped>
//   env <NAME>=<escaped value>      (any number)
//   end
// then, any time later:
//   stop <signal number>            (the launcher got that signal: stop as if it came here)
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddprun {

struct AgentHandoff {
  std::string token;
  std::vector<std::pair<std::string, std::string>> env;
};

std::string encode_handoff(const AgentHandoff& handoff);

// Reads one handoff from fd (the agent's stdin), up to and including its "end" line and
// nothing after it. Throws LaunchError on a malformed or truncated handoff, or when none
// arrived within `timeout`.
AgentHandoff read_handoff(int fd, std::chrono::milliseconds timeout);

std::string stop_line(int signal);  // "stop <n>\n"

// A control line after the handoff: the stop signal it carries, or nothing when the
// line is not a stop line.
std::optional<int> parse_stop_line(const std::string& line);

}  // namespace ddprun
