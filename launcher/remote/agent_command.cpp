#include "remote/agent_command.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cli/torchrun_flags.hpp"

namespace ddprun {
namespace {

// Seconds as text that parses back to the same double ("30", "0.25", else 17 digits).
std::string seconds_text(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%g", value);
  if (std::strtod(text, nullptr) != value) std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

}  // namespace

std::string join_numbers(const std::set<int>& numbers) { return join_numbers(std::vector<int>(numbers.begin(), numbers.end())); }

std::string join_numbers(const std::vector<int>& numbers) {
  std::string out;
  for (int n : numbers) {
    if (!out.empty()) out += ',';
    out += std::to_string(n);
  }
  return out;
}

std::vector<std::string> agent_arguments(const LaunchOptions& o, const AgentPlace& place) {
  std::vector<std::string> args = {"--nnodes", std::to_string(place.nnodes), "--node_rank",
                                   std::to_string(place.node_rank), "--nproc_per_node", place.nproc_per_node,
                                   "--rdzv_id", place.run_id};
  if (place.store_endpoint) {
    args.insert(args.end(), {"--rdzv_endpoint", *place.store_endpoint});
  } else {
    args.insert(args.end(), {"--master_addr", o.master_addr});
    if (o.master_port) args.insert(args.end(), {"--master_port", std::to_string(*o.master_port)});
  }
  auto add = [&](const char* flag, const std::string& value) { args.insert(args.end(), {flag, value}); };
  add("--role", o.role);
  add("--max_restarts", std::to_string(o.max_restarts));
  if (o.log_dir) add("--log_dir", *o.log_dir);
  add("--redirects", o.redirects.text());
  add("--tee", o.tee.text());
  if (o.local_ranks_filter) {
    add("--local_ranks_filter", join_numbers(*o.local_ranks_filter));
  }
  if (o.no_python) args.push_back("--no_python");
  if (!o.agent_store) args.push_back("--no_agent_store");
  if (o.module) args.push_back("--module");
  add("--monitor_interval", seconds_text(o.monitor_interval));
  add("--grace_period", seconds_text(o.grace_period));
  add("--join_timeout", seconds_text(o.join_timeout));
  add("--heartbeat_timeout", seconds_text(o.heartbeat_timeout));
  add("--exit_barrier_timeout", seconds_text(o.exit_barrier_timeout));
  add("--stall_timeout", seconds_text(o.stall_timeout));
  add("--stall_action", o.stall_stop ? "stop" : "report");
  auto newer = torchrun_flag_arguments(o);
  args.insert(args.end(), newer.begin(), newer.end());
  if (o.verbose) args.push_back("-v");
  args.push_back("--agent_stdin");
  args.push_back("--");
  args.push_back(o.program);
  args.insert(args.end(), o.program_args.begin(), o.program_args.end());
  return args;
}

std::string shell_quote(const std::string& word) {
  static const std::string kPlain =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,/:=@+%";
  // A word that starts with '=' is quoted too: zsh expands =cmd to cmd's path.
  if (!word.empty() && word[0] != '=' && word.find_first_not_of(kPlain) == std::string::npos) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

std::vector<std::string> ssh_argv(const SshCommand& c) {
  std::vector<std::string> argv = c.ssh_command;
  // Three unanswered probes, one every third of the heartbeat timeout (ssh counts
  // whole seconds, at least 1).
  const int alive_s = std::max(1, static_cast<int>(std::ceil(c.heartbeat_timeout_s / 3)));
  // -T: no terminal, even if the user's config asks for one (a terminal would echo the
  // handoff, token included, back to the console).
  argv.insert(argv.end(), {"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=" + std::to_string(c.connect_timeout_s),
                           "-o", "ServerAliveInterval=" + std::to_string(alive_s), "-o", "ServerAliveCountMax=3"});
  // "--" ends ssh's options, so a host that starts with '-' is never read as one.
  argv.push_back("--");
  argv.push_back(c.host);
  std::string line = "cd " + shell_quote(c.cwd) + " && exec " + shell_quote(c.ddprun);
  for (const auto& a : c.arguments) {
    line += ' ';
    line += shell_quote(a);
  }
  argv.push_back(line);
  return argv;
}

}  // namespace ddprun
