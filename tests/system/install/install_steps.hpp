// What the tests of the installed package and of the wheel share: running a step that
// must succeed, and the shared libraries a program names.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "subprocess.hpp"

namespace install_steps {

// Runs a step; on failure the test stops with everything it printed.
inline testing::RunResult step(const std::string& name, const std::vector<std::string>& argv,
                               std::chrono::milliseconds timeout, const testing::ProcessOptions& options = {}) {
  auto r = testing::run(argv, options, timeout);
  INFO(name << " exited with " << r.status << " after " << r.seconds << " s\n--- stdout\n"
            << r.out << "\n--- stderr\n" << r.err);
  REQUIRE(r.status == 0);
  return r;
}

// The shared libraries a program names in its dynamic section (readelf -d).
inline std::set<std::string> needed_libraries(const std::filesystem::path& program) {
  auto r = step("readelf", {"readelf", "-d", program.string()}, std::chrono::seconds(30));
  std::set<std::string> out;
  const std::regex needed(R"(\(NEEDED\).*\[(.*)\])");
  for (const auto& line : testing::lines_of(r.out)) {
    std::smatch m;
    if (std::regex_search(line, m, needed)) out.insert(m[1].str());
  }
  return out;
}

}  // namespace install_steps
