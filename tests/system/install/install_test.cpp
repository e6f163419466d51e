// The installed package, as a user gets it: `cmake --install` this build into a fresh
// prefix, build a project outside the tree against it (find_package(ddprun): one
// program on ddprun::worker, one on ddprun::comm alone), and run both under the
// installed ddprun. The collectives-only program must link no BLAS, zlib or cuBLAS.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "install_steps.hpp"
#include "subprocess.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const std::string kCmake = CMAKE_COMMAND_PATH;
using install_steps::step;

// Installs this build under `prefix` and configures the consumer project in `build` against it.
void install_and_configure(const fs::path& prefix, const fs::path& build) {
  step("cmake --install", {kCmake, "--install", DDPRUN_BUILD_DIR, "--prefix", prefix.string()}, 120s);
  step("configure the consumer",
       {kCmake, "-S", CONSUMER_SOURCE_DIR, "-B", build.string(), "-G", CMAKE_GENERATOR_NAME,
        "-DCMAKE_PREFIX_PATH=" + prefix.string(), "-DCMAKE_CXX_COMPILER=" CXX_COMPILER_PATH,
        "-DCMAKE_BUILD_TYPE=Release"},
       120s);
}

// The command that linked `target` in the consumer build (Makefiles keep it in
// link.txt, Ninja in build.ninja's rule for the target).
std::string link_command(const fs::path& build, const std::string& target) {
  const fs::path makefile_link = build / "CMakeFiles" / (target + ".dir") / "link.txt";
  if (fs::exists(makefile_link)) return testing::read_file(makefile_link);
  for (const auto& line : testing::lines_of(testing::read_file(build / "build.ninja"))) {
    if (line.rfind("build " + target + ":", 0) == 0) return line;
  }
  FAIL("no link command for " << target << " under " << build);
  return {};
}

}  // namespace

TEST_CASE("the installed package builds outside programs that run under the installed ddprun, and "
          "one that uses collectives only links no BLAS, zlib or cuBLAS",
          "[install]") {
  testing::TempDir tmp;
  const fs::path prefix = tmp / "prefix";
  const fs::path build = tmp / "consumer-build";

  install_and_configure(prefix, build);
  REQUIRE(fs::exists(prefix / "bin" / "ddprun"));
  REQUIRE(fs::exists(prefix / "bin" / "ddp-rendezvous"));
  REQUIRE(fs::exists(prefix / "include" / "ddp" / "init.hpp"));
  REQUIRE(fs::exists(prefix / "include" / "ddp" / "process_group.hpp"));
  REQUIRE(fs::exists(prefix / "include" / "ddp" / "contract" / "worker_env.hpp"));
  step("build the consumer", {kCmake, "--build", build.string()}, 240s);
  const fs::path consumer = build / "consumer";
  const fs::path comm_consumer = build / "comm_consumer";
  REQUIRE(fs::exists(consumer));
  REQUIRE(fs::exists(comm_consumer));

  // The installed launcher, not the build tree's.
  auto r = step("installed ddprun", {(prefix / "bin" / "ddprun").string(), "--nproc_per_node=2", consumer.string()},
                120s);
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  // DDP gave both ranks rank 0's parameters; the sampler split the dataset.
  const std::regex line(R"(\[rank(\d)\]:consumer rank \d of 2: parameters (\S+), samples ([\d ]+))");
  std::map<std::string, std::pair<std::string, std::string>> by_rank;  // rank -> (checksum, samples)
  for (const auto& l : testing::lines_of(r.out)) {
    std::smatch m;
    if (std::regex_search(l, m, line)) by_rank[m[1].str()] = {m[2].str(), m[3].str()};
  }
  REQUIRE(by_rank.size() == 2);
  CHECK(by_rank["0"].first == by_rank["1"].first);
  CHECK(by_rank["0"].second == "0 2 4 6 8");
  CHECK(by_rank["1"].second == "1 3 5 7 9");

  auto c = step("installed ddprun, collectives only",
                {(prefix / "bin" / "ddprun").string(), "--nproc_per_node=2", comm_consumer.string()}, 120s);
  INFO("stdout:\n" << c.out << "\nstderr:\n" << c.err);
  CHECK(c.out.find("comm consumer rank 0 of 2: sum 3, gathered 0 10") != std::string::npos);
  CHECK(c.out.find("comm consumer rank 1 of 2: sum 3, gathered 0 10") != std::string::npos);

  // The link line, not only the result: Debian's linker drops unused shared
  // libraries (--as-needed), so NEEDED alone would hide a dependency that is there.
  const std::string comm_link = link_command(build, "comm_consumer");
  INFO("comm_consumer link command: " << comm_link);
  CHECK(comm_link.find("libddp_comm") != std::string::npos);
  for (const char* lib : {"openblas", "blas", "libz", "-lz ", "cublas", "libddp_train"}) {
    INFO("library " << lib);
    CHECK(comm_link.find(lib) == std::string::npos);
  }
  std::string needed;
  for (const auto& lib : install_steps::needed_libraries(build / "comm_consumer")) needed += lib + " ";
  INFO("comm_consumer NEEDED: " << needed);
  for (const char* lib : {"blas", "libz.", "cublas"}) {
    INFO("library " << lib);
    CHECK(needed.find(lib) == std::string::npos);
  }

  // And the whole runtime does bring the training framework, so the check above can fail.
  const std::string worker_link = link_command(build, "consumer");
  INFO("consumer link command: " << worker_link);
  CHECK(worker_link.find("libddp_train") != std::string::npos);
  CHECK(worker_link.find("blas") != std::string::npos);
}
