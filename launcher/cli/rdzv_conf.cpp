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

// `text` without the white space around it, as torchrun strips keys and values.
std::string trimmed(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string_view::npos) return "";
  const auto last = text.find_last_not_of(" \t\n\r\f\v");
  return std::string(text.substr(first, last - first + 1));
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
  // As torchrun's _parse_rendezvous_config: the whole text, each key and each value
  // stripped of white space; an empty text is no settings; an empty key or value
  // (a trailing comma, "key=") is an error.
  const std::string all = trimmed(text);
  std::string_view rest = all;
  while (!all.empty()) {
    const std::string_view item = rest.substr(0, rest.find(','));
    const bool last = item.size() == rest.size();
    rest.remove_prefix(std::min(rest.size(), item.size() + 1));
    const auto eq = item.find('=');
    const std::string key = trimmed(item.substr(0, eq));
    if (eq == std::string_view::npos || key.empty()) bad("expected key=value, got '" + std::string(item) + "'");
    const std::string value = trimmed(item.substr(eq + 1));
    if (value.empty()) bad(key + " has no value");
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
    } else if (key == "store_type") {  // judged with the backend (options.cpp)
      conf.store_type = value;
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
    if (last) break;
  }
  return conf;
}

std::optional<std::string> judge_store_type(const std::string& value, bool read_by_backend) {
  if (!read_by_backend) {
    return "--rdzv_conf store_type has no effect: only torchrun's c10d rendezvous reads it, not the static one";
  }
  std::string type = value;  // compared in lower case, as torchrun's c10d backend does
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
  if (type == "tcp") return std::nullopt;
  const std::string what = type == "file" ? "store_type=file is torchrun's FileStore on a shared file system; ddprun's "
                                            "rendezvous runs on its TCP store (leave store_type out, or give tcp)"
                                          : "store_type=" + value + " is not tcp or file";
  throw UsageError("invalid --rdzv_conf store_type: " + what);
}

}  // namespace ddprun
