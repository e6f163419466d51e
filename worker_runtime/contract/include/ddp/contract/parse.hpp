// The parsers both sides of the launch contract share: whole-text numbers and
// durations, and a snapshot of environment variables to read them from.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ddp::contract {

using Millis = std::chrono::milliseconds;

// A variable of the launch contract is missing, malformed, or contradicts another.
// what() is one line naming the variable and the value found.
class ContractError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The whole text is a decimal integer (no sign games, trailing junk or overflow).
std::optional<long long> parse_integer(std::string_view text);

// A plain decimal number ("0.5", "30"); "nan", "inf", hex and exponents are refused.
std::optional<double> parse_decimal(std::string_view text);

// Seconds as a plain decimal number, in (0, 1e9].
std::optional<Millis> parse_seconds(std::string_view text);

// Environment variables, read from a snapshot: the process's own, or a map a test
// or a launcher builds. A variable set to the empty string counts as unset.
class Variables {
 public:
  Variables() = default;
  explicit Variables(std::map<std::string, std::string> values);
  // This process's environment, now.
  static Variables from_process();

  std::optional<std::string> get(std::string_view name) const;
  bool has(std::string_view name) const { return get(name).has_value(); }

  // The value as an integer in [lo, hi]; `fallback` when unset. Throws ContractError
  // ("NAME='text' is not an integer in [lo, hi]") for anything else.
  long long integer_or(std::string_view name, long long fallback, long long lo, long long hi) const;
  // As integer_or, but an unset variable throws ContractError ("NAME is not set" and `hint`).
  long long integer(std::string_view name, long long lo, long long hi, std::string_view hint = {}) const;
  // Decimal seconds in (0, 1e9]; nothing when unset; ContractError when malformed.
  std::optional<Millis> seconds(std::string_view name) const;
  // "1" is true, "0" (or unset) false; anything else is a ContractError.
  bool flag(std::string_view name) const;

 private:
  std::map<std::string, std::string, std::less<>> values_;
};

}  // namespace ddp::contract
