// The installed package, as a user gets it: `cmake --install` this build into a fresh
// prefix, build a project outside the tree against it (find_package(ddprun),
// ddprun::worker), and run that program under the installed ddprun.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "subprocess.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const std::string kCmake = CMAKE_COMMAND_PATH;

// Runs a step; on failure the test stops with everything it printed.
testing::RunResult step(const std::string& name, const std::vector<std::string>& argv,
                        std::chrono::milliseconds timeout) {
  auto r = testing::run(argv, {}, timeout);
  INFO(name << " exited with " << r.status << "\n--- stdout\n" << r.out << "\n--- stderr\n" << r.err);
  REQUIRE(r.status == 0);
  return r;
}

}  // namespace

TEST_CASE("the installed package builds an outside project that runs under the installed ddprun", "[install]") {
  testing::TempDir tmp;
  const fs::path prefix = tmp / "prefix";
  const fs::path build = tmp / "consumer-build";

  step("cmake --install", {kCmake, "--install", DDPRUN_BUILD_DIR, "--prefix", prefix.string()}, 120s);
  REQUIRE(fs::exists(prefix / "bin" / "ddprun"));
  REQUIRE(fs::exists(prefix / "bin" / "ddp-rendezvous"));
  REQUIRE(fs::exists(prefix / "include" / "ddp" / "init.hpp"));
  REQUIRE(fs::exists(prefix / "include" / "ddp" / "process_group.hpp"));

  step("configure the consumer",
       {kCmake, "-S", CONSUMER_SOURCE_DIR, "-B", build.string(), "-G", CMAKE_GENERATOR_NAME,
        "-DCMAKE_PREFIX_PATH=" + prefix.string(), "-DCMAKE_CXX_COMPILER=" CXX_COMPILER_PATH,
        "-DCMAKE_BUILD_TYPE=Release"},
       120s);
  step("build the consumer", {kCmake, "--build", build.string()}, 240s);
  const fs::path consumer = build / "consumer";
  REQUIRE(fs::exists(consumer));

  // The installed launcher, not the build tree's.
  auto r = step("installed ddprun", {(prefix / "bin" / "ddprun").string(), "--nproc_per_node=2", consumer.string()},
                120s);
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.out.find("consumer rank 0 of 2: sum 3") != std::string::npos);
  CHECK(r.out.find("consumer rank 1 of 2: sum 3") != std::string::npos);
}
