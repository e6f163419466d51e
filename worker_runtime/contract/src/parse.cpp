#include "ddp/contract/parse.hpp"

#include <charconv>
#include <cmath>

extern char** environ;

namespace ddp::contract {

std::optional<long long> parse_integer(std::string_view text) {
  long long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::optional<double> parse_decimal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == '-')) return std::nullopt;
  }
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::optional<Millis> parse_seconds(std::string_view text) {
  auto sec = parse_decimal(text);
  if (!sec || !(*sec > 0) || *sec > 1e9) return std::nullopt;
  return Millis(static_cast<long long>(std::ceil(*sec * 1000)));
}

Variables::Variables(std::map<std::string, std::string> values) {
  for (auto& [k, v] : values) values_.emplace(k, std::move(v));
}

Variables Variables::from_process() {
  Variables vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    vars.values_.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return vars;
}

std::optional<std::string> Variables::get(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

long long Variables::integer_or(std::string_view name, long long fallback, long long lo, long long hi) const {
  auto text = get(name);
  if (!text) return fallback;
  auto value = parse_integer(*text);
  if (!value || *value < lo || *value > hi) {
    throw ContractError(std::string(name) + "='" + *text + "' is not an integer in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  }
  return *value;
}

long long Variables::integer(std::string_view name, long long lo, long long hi, std::string_view hint) const {
  if (!has(name)) {
    throw ContractError(std::string(name) + " is not set" + (hint.empty() ? "" : ": ") + std::string(hint));
  }
  return integer_or(name, 0, lo, hi);
}

std::optional<Millis> Variables::seconds(std::string_view name) const {
  auto text = get(name);
  if (!text) return std::nullopt;
  auto value = parse_seconds(*text);
  if (!value) throw ContractError(std::string(name) + "='" + *text + "' is not a number of seconds in (0, 1e9]");
  return value;
}

bool Variables::flag(std::string_view name) const {
  auto text = get(name);
  if (!text || *text == "0") return false;
  if (*text == "1") return true;
  throw ContractError(std::string(name) + "='" + *text + "' must be 1 or 0");
}

}  // namespace ddp::contract
