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
//
// The agent answers once, on its stdout, with the line kAgentStartedLine as soon as it
// has read the handoff; the launcher drops that line from the relayed output. It is how
// the launcher tells ssh's own failure (exit status 255 before the agent ever ran:
// unreachable host, refused key) from a 255 after the agent got going (a dropped
// connection, a remote command killed, or a worker's own exit status 255 passed on).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddprun {

struct AgentHandoff {
  std::string token;
  std::vector<std::pair<std::string, std::string>> env;
};

std::string encode_handoff(const AgentHandoff& handoff);

// A name an env line may carry (and a variable one can send): ASCII letters, digits
// and '_', not starting with a digit.
bool valid_variable_name(std::string_view name);

// Reads one handoff from fd (the agent's stdin), up to and including its "end" line and
// nothing after it. Throws LaunchError on a malformed or truncated handoff, or when none
// arrived within `timeout`.
AgentHandoff read_handoff(int fd, std::chrono::milliseconds timeout);

std::string stop_line(int signal);  // "stop <n>\n"

// The agent's "I run" line (without its newline).
inline constexpr const char* kAgentStartedLine = "ddprun-agent started";

// A control line after the handoff: the stop signal it carries, or nothing when the
// line is not a stop line.
std::optional<int> parse_stop_line(const std::string& line);

}  // namespace ddprun
