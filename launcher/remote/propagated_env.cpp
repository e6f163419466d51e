// The variables a launching ddprun sends every node's agent: the default families
// taken from this environment, then --env_file, then -x (propagated_env.hpp).
#include "remote/propagated_env.hpp"

#include <algorithm>
#include <cstdlib>

#include "remote/agent_handoff.hpp"
#include "errors.hpp"
#include "remote/hosts.hpp"

extern char** environ;

namespace ddprun {
namespace {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// The token reaches the agents in the handoff; sending it as a variable too would put
// it where the handoff exists to keep it out of.
constexpr const char* kTokenVariable = "DDPRUN_TOKEN";

bool sent_by_default(std::string_view name) {
  if (name == "CUDA_VISIBLE_DEVICES") return false;  // each host's comes from its GPU picks, or its own
  for (std::string_view prefix : {"NCCL_", "DDP_", "PYTHON", "OMP_", "CUDA_"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return name == "PATH" || name == "LD_LIBRARY_PATH";
}

// Sets name=value: a name already there keeps its position and takes the new value.
void put(EnvList& env, std::string name, std::string value) {
  auto it = std::find_if(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; });
  if (it != env.end()) {
    it->second = std::move(value);
  } else {
    env.emplace_back(std::move(name), std::move(value));
  }
}

void check_name(const std::string& where, const std::string& name) {
  if (!valid_variable_name(name)) {
    throw UsageError(where + ": '" + name + "' is not a variable name (letters, digits and '_', not starting with a digit)");
  }
  if (name == kTokenVariable) {
    throw UsageError(where + ": " + name + " is never sent as a variable; ddprun hands the token to every agent itself");
  }
}

// "value", 'value' or value: the rules in propagated_env.hpp.
std::string env_file_value(std::string_view v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
    return std::string(v.substr(1, v.size() - 2));
  }
  auto end = v.find_last_not_of(" \t");
  return std::string(v.substr(0, end == std::string_view::npos ? 0 : end + 1));
}

void read_env_file(const std::string& path, EnvList& env) {
  const auto lines = read_flag_file("--env_file", path);
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string where = "--env_file " + path + ":" + std::to_string(n + 1);
    std::string_view line = lines[n];
    auto start = line.find_first_not_of(" \t");
    if (start == std::string_view::npos || line[start] == '#') continue;
    line.remove_prefix(start);
    if (line.rfind("export", 0) == 0 && line.size() > 6 && (line[6] == ' ' || line[6] == '\t')) {
      line.remove_prefix(6);
      line.remove_prefix(std::min(line.size(), line.find_first_not_of(" \t")));
    }
    auto eq = line.find('=');
    if (eq == std::string_view::npos) {
      throw UsageError(where + ": expected VAR=value, got '" + std::string(line) + "'");
    }
    const std::string name(line.substr(0, eq));
    check_name(where, name);
    put(env, name, env_file_value(line.substr(eq + 1)));
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> propagated_environment(const LaunchOptions& options) {
  EnvList env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry = *e;
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name(entry.substr(0, eq));
    if (sent_by_default(name) && valid_variable_name(name)) env.emplace_back(std::move(name), std::string(entry.substr(eq + 1)));
  }
  std::sort(env.begin(), env.end());  // environ's order is an accident of how ddprun was started

  if (options.remote.env_file) read_env_file(*options.remote.env_file, env);

  for (const std::string& x : options.remote.exports) {
    auto eq = x.find('=');
    const std::string name = x.substr(0, eq);
    check_name("invalid -x '" + x + "'", name);
    if (eq != std::string::npos) {
      put(env, name, x.substr(eq + 1));
    } else if (const char* value = std::getenv(name.c_str())) {
      put(env, name, value);
    } else {
      throw UsageError("invalid -x '" + x + "': " + name + " is not set here; give its value as -x " + name + "=VALUE");
    }
  }
  return env;
}

}  // namespace ddprun
