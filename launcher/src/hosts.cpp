// STUB (replaced by the host-list work): --hosts h:N only, no --include/--exclude,
// and only PATH and LD_LIBRARY_PATH propagated.
#include "hosts.hpp"

#include <cstdlib>

#include "ddp/contract/parse.hpp"
#include "errors.hpp"
#include "options.hpp"

namespace ddprun {

std::vector<HostEntry> resolve_hosts(const LaunchOptions& options) {
  if (!options.remote.hosts) throw UsageError("--hostfile is not implemented yet");
  std::vector<HostEntry> out;
  std::string_view rest = *options.remote.hosts;
  while (!rest.empty()) {
    std::string_view item = rest.substr(0, rest.find(','));
    rest.remove_prefix(std::min(rest.size(), item.size() + 1));
    HostEntry e;
    auto colon = item.find(':');
    e.host = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      auto n = ddp::contract::parse_integer(item.substr(colon + 1));
      if (!n || *n < 1) throw UsageError("invalid --hosts '" + *options.remote.hosts + "'");
      e.slots = static_cast<int>(*n);
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string nproc_for(const HostEntry& host, const LaunchOptions& options) {
  if (options.nproc_per_node_given) return options.nproc_per_node;
  if (host.devices) return std::to_string(host.devices->size());
  return host.slots ? std::to_string(*host.slots) : std::string("1");
}

std::vector<std::pair<std::string, std::string>> propagated_environment(const LaunchOptions&) {
  std::vector<std::pair<std::string, std::string>> env;
  for (const char* name : {"PATH", "LD_LIBRARY_PATH"}) {
    if (const char* v = std::getenv(name)) env.emplace_back(name, v);
  }
  return env;
}

}  // namespace ddprun
