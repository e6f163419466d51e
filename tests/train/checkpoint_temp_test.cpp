// Checkpoint temporary files: a save that fails removes its own, and one that a killed
// writer left is removed by the next save on this host, while a live writer's and
// another host's stay. The writers are real forked processes, killed or failed through
// the file size limit (RLIMIT_FSIZE): SIGXFSZ kills the writer mid-write, or, ignored,
// makes its write fail with EFBIG.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/checkpoint.hpp"
#include "ddp/nn.hpp"
#include "ddp/types.hpp"
#include "forked.hpp"
#include "subprocess.hpp"
#include "temp_file.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr rlim_t kFileLimit = 4096;  // bytes a limited writer gets out before its write fails

// A model whose checkpoint is well over kFileLimit (about 17 KB).
std::unique_ptr<ddp::Sequential> model() { return ddp::make_mlp({{64, 64, 4}, 1}); }

// The names of the temporary files of `dir`/ckpt.
std::vector<std::string> temps(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt.tmp.", 0) == 0) out.push_back(name);
  }
  return out;
}

// In a forked child: no core file, and files of at most kFileLimit bytes.
void limit_file_size() {
  rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
  rlimit small{kFileLimit, kFileLimit};
  setrlimit(RLIMIT_FSIZE, &small);
}

ddp::CheckpointInfo at_epoch(int64_t epoch) {
  ddp::CheckpointInfo info;
  info.epoch = epoch;
  return info;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

TEST_CASE("a writer killed mid-save leaves a temporary file that the next save on this host removes",
          "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string path = (dir / "ckpt").string();
  // Another machine id's (this host's is another hash, but for once in 4 billion), or
  // named by the older scheme: never touched.
  const std::string other_host = "ckpt.tmp.0badf00d.1.1";
  const std::string old_scheme = "ckpt.tmp.12345";
  for (const auto& name : {other_host, old_scheme}) std::ofstream(dir / name) << "partial";

  testing::ForkedChild writer([&] {
    limit_file_size();
    signal(SIGXFSZ, SIG_DFL);  // the write past the limit kills the writer
    auto m = model();
    ddp::save_checkpoint(path, *m, nullptr, at_epoch(1));
    return std::string("saved");
  });
  auto r = writer.wait(30s);
  REQUIRE(r.status == 128 + SIGXFSZ);
  auto left = temps(dir.path());
  REQUIRE(left.size() == 3);
  std::string killed;
  for (const auto& name : left) {
    if (name.find("." + std::to_string(writer.pid()) + ".") != std::string::npos) killed = name;
  }
  REQUIRE(!killed.empty());
  CHECK(fs::file_size(dir / killed) == kFileLimit);

  auto m = model();
  ddp::save_checkpoint(path, *m, nullptr, at_epoch(2));
  left = temps(dir.path());
  CHECK(!contains(left, killed));
  CHECK(contains(left, other_host));
  CHECK(contains(left, old_scheme));
  CHECK(left.size() == 2);
  CHECK(ddp::load_checkpoint(path, *m, nullptr).epoch == 2);
}

TEST_CASE("a stopped writer's temporary file stays until the writer is gone", "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string path = (dir / "ckpt").string();
  testing::ForkedChild writer([&] {
    limit_file_size();
    signal(SIGXFSZ, [](int) { raise(SIGSTOP); });  // stops mid-save, alive
    auto m = model();
    ddp::save_checkpoint(path, *m, nullptr, at_epoch(1));
    return std::string("saved");
  });
  bool stopped = false;
  for (int i = 0; i < 500 && !stopped; ++i) {
    std::ifstream stat("/proc/" + std::to_string(writer.pid()) + "/stat");
    std::string text;
    std::getline(stat, text);
    stopped = text.find(") T ") != std::string::npos || text.find(") t ") != std::string::npos;
    if (!stopped) std::this_thread::sleep_for(10ms);
  }
  REQUIRE(stopped);
  REQUIRE(temps(dir.path()).size() == 1);

  auto m = model();
  ddp::save_checkpoint(path, *m, nullptr, at_epoch(2));
  CHECK(temps(dir.path()).size() == 1);  // its writer may still go on

  kill(writer.pid(), SIGKILL);
  CHECK(writer.wait(10s).status == 128 + SIGKILL);
  ddp::save_checkpoint(path, *m, nullptr, at_epoch(3));
  CHECK(temps(dir.path()).empty());
  CHECK(ddp::load_checkpoint(path, *m, nullptr).epoch == 3);
}

TEST_CASE("a save that fails leaves no temporary file", "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string path = (dir / "ckpt").string();

  SECTION("its write fails (file size limit)") {
    testing::ForkedChild writer([&] {
      limit_file_size();
      signal(SIGXFSZ, SIG_IGN);  // the write past the limit fails with EFBIG
      auto m = model();
      try {
        ddp::save_checkpoint(path, *m, nullptr, at_epoch(1));
      } catch (const ddp::Error& e) {
        return std::string("failed: ") + e.what();
      }
      return std::string("saved");
    });
    auto r = writer.wait(30s);
    INFO(r.payload);
    REQUIRE(r.ok);
    CHECK(r.payload.rfind("failed: ", 0) == 0);
    CHECK(r.payload.find("write failed") != std::string::npos);
  }
  SECTION("its rename fails (a folder where the checkpoint goes)") {
    fs::create_directories(dir / "ckpt" / "inside");
    auto m = model();
    CHECK_THROWS_WITH(ddp::save_checkpoint(path, *m, nullptr, at_epoch(1)),
                      Catch::Contains("cannot rename the checkpoint into place"));
  }
  CHECK(temps(dir.path()).empty());
}

TEST_CASE("a checkpoint whose name is 200 bytes long saves, and its temporary file fits", "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string base(200, 'c');  // the temporary name adds at most 45 bytes: under NAME_MAX (255)
  const std::string path = (dir / base).string();
  auto m = model();
  ddp::save_checkpoint(path, *m, nullptr, at_epoch(4));
  CHECK(ddp::load_checkpoint(path, *m, nullptr).epoch == 4);
  const std::string temp = ddp::temp_file::name_for(path);
  CHECK(temp.size() - path.size() <= 45);
}
