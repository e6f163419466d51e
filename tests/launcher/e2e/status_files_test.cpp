// `ddprun status` and the files of its runtime folder that are not its own: it reads
// only names of its runtime files' pattern, at most kMaxRuntimeFile bytes of each,
// never blocks on one, and removes only a runtime file whose ddprun is gone; anything
// else is left in place (with a one-line note when the name looks like its own).
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "e2e.hpp"

using namespace testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// A pid that no longer runs: a child already reaped.
std::string dead_pid() { return lines_of(run({"/bin/sh", "-c", "echo $$"}).out).at(0); }

// A sparse file of `bytes` bytes (reading it whole would take its size in memory).
void make_sparse(const fs::path& path, uintmax_t bytes) {
  write_file(path, "");
  fs::resize_file(path, bytes);
}

}  // namespace

TEST_CASE("ddprun status leaves foreign, oversized and unreadable files in its folder alone and answers quickly",
          "[e2e][status]") {
  TempDir runtime;
  const fs::path dir = runtime / "ddprun";
  fs::create_directory(dir);
  fs::permissions(dir, fs::perms::owner_all);
  const std::string gone = dead_pid();
  const uintmax_t big = uintmax_t{200} << 20;
  make_sparse(dir / "huge.bin", big);                  // not its name: never read
  write_file(dir / "notes.txt", "not a runtime file\n");  // not its name either
  make_sparse(dir / ("bigjob." + gone), big);          // its name, 200 MiB: not read
  write_file(dir / ("garbled." + gone), "hello\n");    // its name, not its format
  // Its name and format, but another pid inside than in the name: not recognised as its own.
  write_file(dir / ("mixed." + gone), "run_id=mixed\npid=1\nstore_addr=127.0.0.1\nstore_port=1\nworld_size=2\n");
  REQUIRE(mkfifo((dir / ("fifo." + gone)).c_str(), 0600) == 0);  // opening it for reading would block
  // A stale runtime file proper: removed, as before.
  write_file(dir / ("deadjob." + gone),
             "run_id=deadjob\npid=" + gone + "\nstore_addr=127.0.0.1\nstore_port=1\nattempt=0\nworld_size=2\n");

  ProcessOptions env;
  env.set_env["XDG_RUNTIME_DIR"] = runtime.path().string();
  auto r = run(e2e::ddprun({"status"}), env, 20s);
  INFO(r.err);
  CHECK(r.status == 1);  // no running job
  CHECK(r.seconds < 5);
  CHECK(contains(r.err, "bigjob." + gone + " has 209715200 bytes, more than a runtime file has (at most 1048576); "
                        "left it in place"));
  CHECK(contains(r.err, "garbled." + gone + " cannot be read as a runtime file; left it in place"));
  CHECK(contains(r.err, "mixed." + gone + " names job mixed and pid 1, not those of its file name; left it in place"));
  CHECK(contains(r.err, "fifo." + gone + " is not a plain file; left it in place"));
  CHECK(contains(r.err, "deadjob." + gone + " is stale: its ddprun (pid " + gone + ", job deadjob) is gone; removed it"));
  CHECK(!contains(r.err, "huge.bin"));
  CHECK(!contains(r.err, "notes.txt"));
  for (const auto& name : {"huge.bin", "notes.txt"}) CHECK(fs::exists(dir / name));
  for (const auto& name : {"bigjob.", "garbled.", "mixed.", "fifo."}) CHECK(fs::exists(fs::symlink_status(dir / (name + gone))));
  CHECK(fs::file_size(dir / "huge.bin") == big);
  CHECK(!fs::exists(dir / ("deadjob." + gone)));

  // A running job is still found among them.
  Process job(e2e::ddprun({"--nproc_per_node=1", "--standalone", "--rdzv_id=livejob", e2e::kWorker, "progress",
                           "steady"}),
              env);
  RunResult live;
  for (int i = 0; i < 100; ++i) {
    live = run(e2e::ddprun({"status"}), env, 20s);
    if (live.status == 0) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(live.out << live.err << job.err());
  CHECK(live.status == 0);
  CHECK(contains(live.out, "job livejob, attempt 0, 1 rank(s)"));
  CHECK(fs::exists(dir / "huge.bin"));
  job.send_signal(SIGTERM);
  REQUIRE(job.wait(30s).has_value());
}
