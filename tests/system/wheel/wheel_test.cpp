// The Python wheel, as a user gets it: pip builds it from this checkout
// (pyproject.toml, scikit-build-core fetched from PyPI), it installs into a fresh
// virtual environment (with the system's site packages, so Debian's torch is there),
// and the environment's ddprun and ddp-rendezvous run: --version, --help, and an
// unmodified torch DDP script with 2 workers on the gloo backend.
//
// Building the wheel takes minutes, so it is built once per build tree: the wheel and
// a fingerprint of the sources that go into it stay under the build's wheel/ folder,
// and the wheel is built again only when the fingerprint changes.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "../install/install_steps.hpp"
#include "subprocess.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const fs::path kSourceDir = PROJECT_SOURCE_DIR;
const fs::path kCacheDir = WHEEL_CACHE_DIR;
const std::string kPython = "/usr/bin/python3";
using install_steps::needed_libraries;
using install_steps::step;

// What the wheel is built from: the build definition and the two programs' sources.
const std::vector<std::string> kWheelInputs = {"pyproject.toml", "CMakeLists.txt", "README.md", "cmake",
                                               "launcher", "rendezvous", "worker_runtime/contract"};

// FNV-1a over the inputs' relative paths and contents, in path order.
std::string sources_fingerprint() {
  std::vector<fs::path> files;
  for (const auto& input : kWheelInputs) {
    const fs::path p = kSourceDir / input;
    if (fs::is_regular_file(p)) {
      files.push_back(p);
      continue;
    }
    for (const auto& entry : fs::recursive_directory_iterator(p)) {
      if (entry.is_regular_file() && entry.path().string().find("__pycache__") == std::string::npos) {
        files.push_back(entry.path());
      }
    }
  }
  std::sort(files.begin(), files.end());
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&h](const std::string& bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // a separator, so "ab"+"c" differs from "a"+"bc"
  };
  for (const auto& f : files) {
    mix(fs::relative(f, kSourceDir).string());
    mix(testing::read_file(f));
  }
  return std::to_string(h);
}

fs::path cached_wheel() {
  if (!fs::is_directory(kCacheDir)) return {};
  for (const auto& entry : fs::directory_iterator(kCacheDir)) {
    if (entry.path().extension() == ".whl") return entry.path();
  }
  return {};
}

// The wheel of the current sources: the cached one, or a fresh build that replaces it.
fs::path current_wheel() {
  const std::string fingerprint = sources_fingerprint();
  const fs::path stamp = kCacheDir / "fingerprint";
  const fs::path cached = cached_wheel();
  if (!cached.empty() && fs::exists(stamp) && testing::read_file(stamp) == fingerprint) return cached;

  // Built into a scratch folder and moved in, so a build that fails leaves no wheel behind.
  const fs::path scratch = kCacheDir.string() + ".new";
  fs::remove_all(scratch);
  testing::ProcessOptions env;
  env.set_env["CXX"] = CXX_COMPILER_PATH;
  if (std::string(CXX_COMPILER_LAUNCHER).size()) env.set_env["CMAKE_CXX_COMPILER_LAUNCHER"] = CXX_COMPILER_LAUNCHER;
  step("pip wheel",
       {kPython, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", scratch.string(),
        kSourceDir.string()},
       1200s, env);
  testing::write_file(scratch / "fingerprint", fingerprint);
  fs::remove_all(kCacheDir);
  fs::rename(scratch, kCacheDir);
  const fs::path built = cached_wheel();
  REQUIRE(!built.empty());
  return built;
}

}  // namespace

TEST_CASE("the wheel installs ddprun and ddp-rendezvous into a fresh virtual environment, they need glibc "
          "alone, and its ddprun runs a torch DDP script with 2 workers",
          "[wheel]") {
  const fs::path wheel = current_wheel();
  INFO("wheel: " << wheel);
  CHECK(wheel.filename().string().rfind(std::string("ddprun-") + DDPRUN_VERSION + "-py3-none-", 0) == 0);

  testing::TempDir tmp;
  const fs::path venv = tmp / "venv";
  step("venv", {kPython, "-m", "venv", "--system-site-packages", venv.string()}, 120s);
  const fs::path bin = venv / "bin";
  step("pip install",
       {(bin / "pip").string(), "install", "--no-index", "--no-deps", "--disable-pip-version-check",
        wheel.string()},
       120s);
  REQUIRE(fs::exists(bin / "ddprun"));
  REQUIRE(fs::exists(bin / "ddp-rendezvous"));

  // glibc's libraries only: libstdc++, spdlog, fmt and libcrypto are linked in.
  const std::set<std::string> glibc = {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libpthread.so.0",
                                       "libdl.so.2", "librt.so.1"};
  for (const char* program : {"ddprun", "ddp-rendezvous"}) {
    for (const auto& lib : needed_libraries(bin / program)) {
      INFO(program << " needs " << lib);
      CHECK(glibc.count(lib) == 1);
    }
  }

  auto version = step("ddprun --version", {(bin / "ddprun").string(), "--version"}, 30s);
  CHECK(version.out == std::string("ddprun ") + DDPRUN_VERSION + "\n");
  auto help = step("ddp-rendezvous --help", {(bin / "ddp-rendezvous").string(), "--help"}, 30s);
  CHECK(help.out.find("--port") != std::string::npos);

  // As in an activated environment: the venv's python3 runs the script (with Debian's torch).
  testing::ProcessOptions activated;
  activated.set_env["PATH"] = bin.string() + ":/usr/local/bin:/usr/bin:/bin";
  activated.set_env["VIRTUAL_ENV"] = venv.string();
  activated.unset_env = {"PYTHON_EXEC", "PYTHONHOME", "PYTHONPATH"};
  auto r = step("ddprun (venv) torch DDP",
                {(bin / "ddprun").string(), "--nproc_per_node=2", "--standalone", TORCH_DDP_SCRIPT}, 180s, activated);
  const std::regex line(R"(rank=(\d) world=(\d) allreduce=(\S+) checksum=(\S+))");
  std::set<std::string> ranks;
  std::set<std::string> checksums;
  for (const auto& l : testing::lines_of(r.out)) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    ranks.insert(m[1].str());
    checksums.insert(m[4].str());
    CHECK(m[2].str() == "2");
    CHECK(m[3].str() == "3");  // 1 + 2
  }
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(ranks == std::set<std::string>{"0", "1"});
  CHECK(checksums.size() == 1);  // DDP gave both ranks rank 0's parameters
}
