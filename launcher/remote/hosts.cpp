// The host list of a launch from one command: --hostfile / --hosts parsed into
// HostEntry records, then --include / --exclude (DeepSpeed's "h1:0,2@h2") applied.
// The rules are documented on resolve_hosts in hosts.hpp.
#include "remote/hosts.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "ddp/contract/parse.hpp"
#include "errors.hpp"
#include "cli/launch_options.hpp"

namespace ddprun {
namespace {

// Far above any node's GPU or CPU count, low enough that a typo is caught.
constexpr long long kMaxSlots = 4096;

// A host is handed to ssh as one argument (and to a shell on the other side only
// quoted), so refuse what ssh would read as an option and what no host name holds.
bool valid_host(std::string_view host) {
  if (host.empty() || host.front() == '-') return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._-:@%", c) != nullptr;
  });
}

// A host with a ':' in a hostfile must be an IPv6 address (optionally with a %zone):
// "h1:4" is MPICH's and Horovod's way to give slots, which would only fail later as a
// host that cannot be resolved.
bool ipv6_address(const std::string& host) {
  const size_t at = host.find('@');  // user@address
  const std::string address = host.substr(at == std::string::npos ? 0 : at + 1);
  in6_addr addr{};
  return inet_pton(AF_INET6, address.substr(0, address.find('%')).c_str(), &addr) == 1;
}

// "host", "host:SUFFIX", "[v6]" or "[v6]:SUFFIX" (of --hosts and --include/--exclude).
struct HostItem {
  std::string host;
  std::optional<std::string> suffix;  // after the ':' that ends the host
};

std::optional<HostItem> split_host_item(std::string_view item) {
  HostItem out;
  std::string_view rest;
  if (!item.empty() && item.front() == '[') {
    auto close = item.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    out.host = std::string(item.substr(1, close - 1));
    rest = item.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return std::nullopt;
  } else {
    auto colon = item.find(':');
    out.host = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) rest = item.substr(colon);
  }
  if (!rest.empty()) out.suffix = std::string(rest.substr(1));
  if (!valid_host(out.host)) return std::nullopt;
  return out;
}

std::optional<int> count_in(std::string_view text, long long lo, long long hi) {
  auto n = ddp::contract::parse_integer(text);
  if (!n || *n < lo || *n > hi) return std::nullopt;
  return static_cast<int>(*n);
}

// The pieces of `text` between `sep`s; an empty piece stays (callers refuse it).
std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    auto at = text.find(sep);
    out.push_back(text.substr(0, at));
    if (at == std::string_view::npos) return out;
    text.remove_prefix(at + 1);
  }
}

std::vector<HostEntry> parse_hostfile(const std::string& path) {
  std::vector<HostEntry> out;
  const auto lines = read_flag_file("--hostfile", path);
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string where = "--hostfile " + path + ":" + std::to_string(n + 1);
    std::string_view line = lines[n];
    line = line.substr(0, line.find('#'));
    std::vector<std::string> tokens;
    for (size_t i = 0; i < line.size();) {
      auto start = line.find_first_not_of(" \t", i);
      if (start == std::string_view::npos) break;
      auto end = std::min(line.find_first_of(" \t", start), line.size());
      tokens.emplace_back(line.substr(start, end - start));
      i = end;
    }
    if (tokens.empty()) continue;
    HostEntry e;
    e.host = tokens[0];
    if (!valid_host(e.host)) {
      throw UsageError(where + ": '" + e.host + "' is not a host name or address");
    }
    if (e.host.find(':') != std::string::npos && !ipv6_address(e.host)) {
      const auto colon = e.host.rfind(':');
      throw UsageError(where + ": '" + e.host + "' is not a host name or address; a hostfile gives slots as '" +
                       e.host.substr(0, colon) + " slots=" + e.host.substr(colon + 1) + "'");
    }
    bool max_slots_seen = false;
    for (size_t t = 1; t < tokens.size(); ++t) {
      const std::string& tok = tokens[t];
      auto eq = tok.find('=');
      const std::string key = tok.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : tok.substr(eq + 1);
      const bool repeated = key == "slots" ? e.slots.has_value() : max_slots_seen;
      if ((key != "slots" && key != "max_slots") || eq == std::string::npos) {
        throw UsageError(where + ": unknown token '" + tok + "' (a line is 'host slots=N', optionally max_slots=M)");
      }
      if (repeated) throw UsageError(where + ": " + key + " given twice");
      if (key == "slots" && value == "0") {
        throw UsageError(where + ": slots=0: a node runs at least one worker; leave the host out instead");
      }
      auto count = count_in(value, 1, kMaxSlots);
      if (!count) throw UsageError(where + ": '" + tok + "': expected " + key + "=N with N in 1-4096");
      if (key == "slots") {
        e.slots = count;
      } else {
        max_slots_seen = true;  // OpenMPI's oversubscription limit: ddprun never oversubscribes
      }
    }
    for (const auto& earlier : out) {
      if (earlier.host == e.host) throw UsageError(where + ": host '" + e.host + "' is given twice");
    }
    out.push_back(std::move(e));
  }
  if (out.empty()) throw UsageError("--hostfile " + path + " names no host");
  return out;
}

std::vector<HostEntry> parse_hosts_flag(const std::string& text) {
  std::vector<HostEntry> out;
  auto bad = [&](const std::string& why) { throw UsageError("invalid --hosts '" + text + "': " + why); };
  for (std::string_view item : split(text, ',')) {
    if (item.empty()) bad("an empty host between commas");
    auto parsed = split_host_item(item);
    if (!parsed) {
      bad("'" + std::string(item) + "' is not HOST or HOST:SLOTS (IPv6 addresses go in brackets: [::1]:2)");
    }
    HostEntry e;
    e.host = parsed->host;
    if (parsed->suffix) {
      e.slots = count_in(*parsed->suffix, 1, kMaxSlots);
      if (!e.slots) bad("'" + std::string(item) + "': the slots after ':' must be a count in 1-4096");
    }
    for (const auto& earlier : out) {
      if (earlier.host == e.host) bad("host '" + e.host + "' is given twice");
    }
    out.push_back(std::move(e));
  }
  return out;
}

// One host of --include/--exclude, with the GPU indices named (none: the whole host).
struct FilterItem {
  std::string host;
  std::optional<std::set<int>> indices;
};

std::vector<FilterItem> parse_filter(const std::string& flag, const std::string& text,
                                     const std::vector<HostEntry>& hosts) {
  std::vector<FilterItem> out;
  auto bad = [&](const std::string& why) { throw UsageError("invalid " + flag + " '" + text + "': " + why); };
  for (std::string_view item : split(text, '@')) {
    if (item.empty()) bad("an empty host between '@' (the syntax is h1:0,2@h2)");
    auto parsed = split_host_item(item);
    if (!parsed) bad("'" + std::string(item) + "' is not HOST or HOST:I,J (IPv6 addresses go in brackets)");
    FilterItem f{parsed->host, std::nullopt};
    auto entry = std::find_if(hosts.begin(), hosts.end(), [&](const HostEntry& h) { return h.host == f.host; });
    if (entry == hosts.end()) bad("host '" + f.host + "' is not in the host list");
    for (const auto& earlier : out) {
      if (earlier.host == f.host) bad("host '" + f.host + "' is named twice");
    }
    if (parsed->suffix) {
      f.indices.emplace();
      for (std::string_view index : split(*parsed->suffix, ',')) {
        auto i = count_in(index, 0, kMaxSlots - 1);
        if (!i) bad("'" + std::string(index) + "' in '" + std::string(item) + "' is not a GPU index");
        if (entry->slots && *i >= *entry->slots) {
          bad("GPU index " + std::to_string(*i) + " of '" + f.host + "' is not below its slots=" +
              std::to_string(*entry->slots));
        }
        f.indices->insert(*i);
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<HostEntry> apply_include(std::vector<HostEntry> hosts, const std::string& text) {
  const auto picks = parse_filter("--include", text, hosts);
  std::vector<HostEntry> out;
  for (auto& h : hosts) {  // the list's order, not the filter's: node ranks follow the list
    auto pick = std::find_if(picks.begin(), picks.end(), [&](const FilterItem& f) { return f.host == h.host; });
    if (pick == picks.end()) continue;
    if (pick->indices) h.devices = std::vector<int>(pick->indices->begin(), pick->indices->end());
    out.push_back(std::move(h));
  }
  return out;
}

std::vector<HostEntry> apply_exclude(std::vector<HostEntry> hosts, const std::string& text) {
  const auto drops = parse_filter("--exclude", text, hosts);
  std::vector<HostEntry> out;
  for (auto& h : hosts) {
    auto drop = std::find_if(drops.begin(), drops.end(), [&](const FilterItem& f) { return f.host == h.host; });
    if (drop == drops.end()) {
      out.push_back(std::move(h));
      continue;
    }
    if (!drop->indices) continue;  // the whole host
    if (!h.slots) {
      throw UsageError("invalid --exclude '" + text + "': host '" + h.host +
                       "' has no slots in the host list, so its GPUs are unknown; give it slots=N or pick "
                       "GPUs with --include");
    }
    std::vector<int> kept;
    for (int i = 0; i < *h.slots; ++i) {
      if (!drop->indices->count(i)) kept.push_back(i);
    }
    if (kept.empty()) {
      throw UsageError("invalid --exclude '" + text + "': it leaves host '" + h.host +
                       "' no GPU; to leave the host out, exclude it whole: --exclude " + h.host);
    }
    h.devices = std::move(kept);
    out.push_back(std::move(h));
  }
  if (out.empty()) throw UsageError("invalid --exclude '" + text + "': no host is left");
  return out;
}

}  // namespace

std::optional<std::string> cuda_visible_devices(const HostEntry& host) {
  if (!host.devices) return std::nullopt;
  std::string out;
  for (int i : *host.devices) out += (out.empty() ? "" : ",") + std::to_string(i);
  return out;
}

std::vector<std::string> read_flag_file(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw LaunchError("cannot read " + flag + " " + path + ": " + std::strerror(errno));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  if (in.bad()) throw LaunchError("cannot read " + flag + " " + path + ": " + std::strerror(errno));
  return lines;
}

std::vector<HostEntry> resolve_hosts(const LaunchOptions& options) {
  const RemoteOptions& r = options.remote;  // parse_command_line refused --hostfile with --hosts, --include with --exclude
  std::vector<HostEntry> hosts;
  if (r.hostfile) {
    hosts = parse_hostfile(*r.hostfile);
  } else if (r.hosts) {
    hosts = parse_hosts_flag(*r.hosts);
  } else {
    throw UsageError("no host list: give --hostfile FILE or --hosts h1:N,h2:N");
  }
  if (r.include) hosts = apply_include(std::move(hosts), *r.include);
  if (r.exclude) hosts = apply_exclude(std::move(hosts), *r.exclude);

  // A fixed worker count and a GPU pick that disagree would start workers without a
  // GPU of their own (or leave picked GPUs idle): say so instead of guessing.
  if (options.nproc_per_node_given && ddp::contract::parse_integer(options.nproc_per_node)) {
    for (const auto& h : hosts) {
      if (h.devices && std::to_string(h.devices->size()) != options.nproc_per_node) {
        throw UsageError("--nproc_per_node=" + options.nproc_per_node + " but " +
                         std::string(r.include ? "--include" : "--exclude") + " picks " +
                         std::to_string(h.devices->size()) + " GPU(s) on '" + h.host + "' (" +
                         *cuda_visible_devices(h) + "): drop --nproc_per_node, or pick that many GPUs");
      }
    }
  }
  return hosts;
}

std::string nproc_for(const HostEntry& host, const LaunchOptions& options) {
  if (options.nproc_per_node_given) return options.nproc_per_node;
  if (host.devices) return std::to_string(host.devices->size());
  return host.slots ? std::to_string(*host.slots) : std::string("1");
}

}  // namespace ddprun
