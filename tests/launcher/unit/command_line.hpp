// ddprun's command line parsed in process, for the unit tests of its flags.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "errors.hpp"
#include "cli/options.hpp"

namespace command_line {

// The options of `ddprun ARGS...` (ARGS must name a program: --help gives none).
inline ddprun::LaunchOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  auto parsed = ddprun::parse_command_line(static_cast<int>(argv.size()), argv.data());
  REQUIRE(parsed.options.has_value());
  return *parsed.options;
}

// The message of the UsageError that `ddprun ARGS...` is refused with.
inline std::string usage_error(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const ddprun::UsageError& e) {
    return e.what();
  }
  FAIL("expected a UsageError");
  return {};
}

// As parse and usage_error, for flags that need no particular program ("prog" is added).
inline ddprun::LaunchOptions parse_flags(std::vector<std::string> flags) {
  flags.push_back("prog");
  return parse(std::move(flags));
}
inline std::string flags_error(std::vector<std::string> flags) {
  flags.push_back("prog");
  return usage_error(std::move(flags));
}

}  // namespace command_line
