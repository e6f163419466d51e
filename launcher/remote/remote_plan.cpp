// What `ddprun -v --hostfile ...` prints before starting the agents: every node and
// everything sent to it, so a user can check a launch from one command at a glance.
#include "remote/remote_plan.hpp"

#include <cstdio>

namespace ddprun {
namespace {

// A value on one console line: control characters (a newline from -x VAR=$'a\nb')
// shown as escapes rather than breaking the listing.
std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// Where a host's worker count comes from, the order nproc_for applies.
const char* count_source(const HostEntry& host, const LaunchOptions& options) {
  if (options.nproc_per_node_given) return "--nproc_per_node";
  if (host.devices) return "GPUs picked";
  return host.slots ? "slots" : "default";
}

}  // namespace

std::string describe_remote_plan(const std::vector<HostEntry>& hosts,
                                 const std::vector<std::pair<std::string, std::string>>& env,
                                 const LaunchOptions& options) {
  std::string out = "ddprun: " + std::to_string(hosts.size()) + " node(s) from " +
                    (options.remote.hostfile ? "--hostfile " + *options.remote.hostfile : std::string("--hosts")) +
                    "\n";
  for (size_t rank = 0; rank < hosts.size(); ++rank) {
    const HostEntry& h = hosts[rank];
    out += "  node " + std::to_string(rank) + ": " + h.host + "  workers=" + nproc_for(h, options) + " (" +
           count_source(h, options) + ")";
    if (auto devices = cuda_visible_devices(h)) out += "  CUDA_VISIBLE_DEVICES=" + *devices;
    out += "\n";
  }
  std::string ssh;
  for (const auto& word : options.remote.ssh_command) ssh += (ssh.empty() ? "" : " ") + printable(word);
  out += "  agents: " + ssh + " HOST " +
         (options.remote.remote_ddprun ? *options.remote.remote_ddprun : std::string("(this ddprun's path)")) +
         " (or a child process for this machine)\n";
  out += "  variables sent to every node (" + std::to_string(env.size()) + "):\n";
  for (const auto& [name, value] : env) out += "    " + name + "=" + printable(value) + "\n";
  return out;
}

}  // namespace ddprun
