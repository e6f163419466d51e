#include "ddp/launch_env.hpp"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace ddp {
namespace {

std::optional<std::string> lookup(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// Parses a whole decimal integer within [lo, hi]; anything else is an error naming `name`.
int parse_int(const char* name, const std::string& text, int lo, int hi) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < lo || value > hi) {
    throw LaunchEnvError(std::string(name) + "='" + text + "' is not an integer in [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return value;
}

int required_int(const char* name, int lo, int hi) {
  auto text = lookup(name);
  if (!text) throw LaunchEnvError(std::string(name) + " is not set (is this process started by ddprun or torchrun?)");
  return parse_int(name, *text, lo, hi);
}

int optional_int(const char* name, int fallback, int lo, int hi) {
  auto text = lookup(name);
  return text ? parse_int(name, *text, lo, hi) : fallback;
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  constexpr int kMaxInt = 1 << 30;
  LaunchEnv env;
  env.world_size = required_int("WORLD_SIZE", 1, kMaxInt);
  env.rank = required_int("RANK", 0, env.world_size - 1);
  env.local_world_size = optional_int("LOCAL_WORLD_SIZE", env.world_size, 1, env.world_size);
  env.local_rank = optional_int("LOCAL_RANK", env.rank, 0, env.local_world_size - 1);
  env.group_world_size = optional_int("GROUP_WORLD_SIZE", 1, 1, env.world_size);
  env.group_rank = optional_int("GROUP_RANK", 0, 0, env.group_world_size - 1);
  env.role_name = lookup("ROLE_NAME").value_or("default");
  env.master_addr = lookup("MASTER_ADDR").value_or("");
  if (env.master_addr.empty()) throw LaunchEnvError("MASTER_ADDR is not set");
  env.master_port = required_int("MASTER_PORT", 1, 65535);
  env.run_id = lookup("TORCHELASTIC_RUN_ID").value_or("");
  env.restart_count = optional_int("TORCHELASTIC_RESTART_COUNT", 0, 0, kMaxInt);
  return env;
}

}  // namespace ddp
