// Parsing a ddprun command line in tests: argv[0] added, help/version refused.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "options.hpp"

namespace launcher_tests {

inline ddprun::LaunchOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  auto parsed = ddprun::parse_command_line(static_cast<int>(argv.size()), argv.data());
  REQUIRE(parsed.options.has_value());
  return *parsed.options;
}

}  // namespace launcher_tests
