// Strict text-to-number conversion for command-line values: the whole text must
// be the number (no sign games, no trailing junk, no overflow).
#pragma once

#include <charconv>
#include <optional>
#include <string_view>

namespace ddprun {

inline std::optional<long long> parse_integer(std::string_view text) {
  long long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// Accepts plain decimal numbers ("0.5", "30"); rejects "nan", "inf", hex and exponents
// that std::from_chars would otherwise allow, since none of them is a sensible duration.
inline std::optional<double> parse_decimal(std::string_view text) {
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

}  // namespace ddprun
