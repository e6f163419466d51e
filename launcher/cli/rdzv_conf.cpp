// --rdzv_conf (rdzv_conf.hpp). The keys are those torchrun 2.x's rendezvous handlers
// read (dynamic_rendezvous.create_handler, the c10d backend, the static handler);
// torchrun itself passes unknown keys through unread, ddprun names them instead.
#include "cli/rdzv_conf.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string_view>

#include "ddp/contract/parse.hpp"
#include "errors.hpp"

namespace ddprun {
namespace {

// torchrun's boolean settings (RendezvousParameters.get_as_bool): 1/0, true/false,
// yes/no, y/n, t/f in any case; nothing for anything else.
std::optional<bool> conf_bool(std::string value) {
  std::transform(value.begin(), value.end(), value.begin(), [](unsigned char c) { return std::tolower(c); });
  if (value == "1" || value == "true" || value == "t" || value == "yes" || value == "y") return true;
  if (value == "0" || value == "false" || value == "f" || value == "no" || value == "n") return false;
  return std::nullopt;
}

// store_type's value as the c10d backend compares it: trimmed, in lower case.
std::string lower_trimmed(const std::string& value) {
  const auto first = value.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string::npos) return "";
  const auto last = value.find_last_not_of(" \t\n\r\f\v");
  std::string out = value.substr(first, last - first + 1);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

constexpr const char* kKeys =
    "join_timeout, timeout, last_call_timeout, close_timeout, heartbeat_timeout, read_timeout, "
    "keep_alive_interval, keep_alive_max_attempt, cas_backoff_max_seconds, store_type, use_agent_store, is_host";

constexpr const char* kHeartbeat = "a silent node is found by the store's heartbeat (--heartbeat_timeout)";

}  // namespace

std::optional<double> seconds_value(const std::string& text, bool allow_zero) {
  auto v = ddp::contract::parse_decimal(text);
  if (!v || !std::isfinite(*v) || *v < 0 || (*v == 0 && !allow_zero) || *v > 86400.0 * 365) return std::nullopt;
  return v;
}

RdzvConf parse_rdzv_conf(const std::string& text) {
  RdzvConf conf;
  auto bad = [&](const std::string& what) {
    throw UsageError("invalid --rdzv_conf '" + text + "': " + what + "; the keys are " + kKeys);
  };
  std::string_view rest = text;
  while (!rest.empty()) {
    std::string_view item = rest.substr(0, rest.find(','));
    rest.remove_prefix(std::min(rest.size(), item.size() + 1));
    auto eq = item.find('=');
    if (eq == std::string_view::npos) bad("expected key=value, got '" + std::string(item) + "'");
    const std::string key(item.substr(0, eq));
    const std::string value(item.substr(eq + 1));
    auto seconds = [&](bool allow_zero) {
      auto v = seconds_value(value, allow_zero);
      if (!v) bad(key + "=" + value + " is not a number of seconds" + (allow_zero ? " >= 0" : " > 0"));
      return *v;
    };
    auto ignored = [&](const std::string& why) { conf.notes.push_back("--rdzv_conf " + key + " has no effect: " + why); };
    if (key == "join_timeout" || key == "timeout") {
      conf.join_timeout = seconds(false);
    } else if (key == "last_call_timeout") {
      conf.last_call_timeout = seconds(true);
    } else if (key == "close_timeout") {
      seconds(true);
      ignored("an attempt closes with one compare-and-set in the store; no node waits after it closed");
    } else if (key == "read_timeout" || key == "keep_alive_interval") {
      seconds(false);
      ignored(kHeartbeat);
    } else if (key == "heartbeat_timeout") {  // torchrun: how long one keep-alive write may take
      seconds(false);
      ignored(std::string("a heartbeat is one message on the open store connection; ") + kHeartbeat);
    } else if (key == "keep_alive_max_attempt") {
      auto count = ddp::contract::parse_integer(value);
      if (!count || *count < 1) bad(key + "=" + value + " is not a count >= 1");
      ignored(kHeartbeat);
    } else if (key == "cas_backoff_max_seconds") {
      seconds(true);
      ignored("the store decides each compare-and-set itself, so a lost one is not retried after a back-off");
    } else if (key == "store_type") {
      const std::string type = lower_trimmed(value);
      if (type == "file") {
        bad("store_type=file is torchrun's FileStore on a shared file system; ddprun's rendezvous runs on its "
            "TCP store (leave store_type out, or give tcp)");
      }
      if (type != "tcp") bad("store_type=" + value + " is not tcp");
    } else if (key == "use_agent_store" || key == "is_host") {
      auto flag = conf_bool(value);
      if (!flag) bad(key + "=" + value + " is not true or false");
      if (key == "is_host") {
        conf.is_host = flag;
      } else {  // torchrun 2.x does not read it either: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is its switch
        ignored("as in torchrun; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (with --rdzv_backend=c10d) or "
                "--no_agent_store makes the workers host their own store");
      }
    } else {
      bad("unknown key '" + key + "'");
    }
  }
  return conf;
}

}  // namespace ddprun
