// Worker output through ddprun: whole prefixed lines under heavy concurrent
// output, log files, --redirects, --tee and --local_ranks_filter, and a log dir
// that fills up.
#include <catch2/catch.hpp>
#include <sys/mount.h>

#include <cstring>

#include "e2e.hpp"

using namespace testing;

namespace {

// Line `i` of test_worker's flood and spill modes, as rank `rank` writes it.
std::string numbered_line(int rank, long i) {
  static const std::string payload(200, 'x');
  return "rank=" + std::to_string(rank) + " i=" + std::to_string(i) + " " +
         payload.substr(0, static_cast<size_t>((i * 37) % 200)) + "|end";
}

// A tmpfs of `size` on a fresh directory for as long as this lives, unmounted
// however the test ends.
class SmallTmpfs {
 public:
  explicit SmallTmpfs(const std::string& size) {
    std::string data = "size=" + size;
    if (mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, data.c_str()) != 0) {
      throw std::runtime_error("cannot mount a tmpfs (the test needs root): " + std::string(std::strerror(errno)));
    }
  }
  ~SmallTmpfs() { umount2(dir_.path().c_str(), MNT_DETACH); }  // before dir_ is removed
  const std::filesystem::path& path() const { return dir_.path(); }

 private:
  TempDir dir_;
};

}  // namespace

TEST_CASE("heavy concurrent output from 4 ranks never splits or mixes a line", "[e2e][output]") {
  const long kLines = 20000;
  auto r = run(e2e::ddprun({"--nproc_per_node=4", "--standalone", e2e::kWorker, "flood", std::to_string(kLines)}),
               {}, 120s);
  REQUIRE(r.status == 0);
  std::map<int, long> next;  // the next line number expected from each rank
  long bad = 0;
  std::string first_bad;  // the first few offending lines, for the failure message
  for (const auto& line : lines_of(r.out)) {
    // "[rankR]:rank=R i=I xxx...|end"
    int rank = -1;
    long i = -1;
    auto reject = [&] {
      if (++bad <= 3) first_bad += line.substr(0, 120) + " (expected line " + std::to_string(next[rank]) + ")\n";
    };
    if (std::sscanf(line.c_str(), "[rank%d]:rank=%*d i=%ld", &rank, &i) != 2 || rank < 0 || rank > 3) {
      reject();
      continue;
    }
    std::string expected = "[rank" + std::to_string(rank) + "]:" + numbered_line(rank, i);
    if (line != expected || i != next[rank]) reject();
    next[rank] = i + 1;
  }
  INFO(first_bad);
  CHECK(bad == 0);
  for (int rank = 0; rank < 4; ++rank) CHECK(next[rank] == kLines);
}

TEST_CASE("log_dir keeps each rank's stdout and stderr under run id/attempt/local rank", "[e2e][output]") {
  TempDir dir;
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--rdzv_id=logs1", "--log_dir",
                            dir.path().string(), e2e::kWorker, "fail", "1", "4"}));
  CHECK(r.status == 4);
  CHECK(read_file(dir / "logs1/attempt_0/1/stderr.log") == "rank 1 failing on purpose\n");
  CHECK(std::filesystem::exists(dir / "logs1/attempt_0/0/stdout.log"));
  CHECK(std::filesystem::exists(dir / "logs1/attempt_0/0/stderr.log"));
  // Without --redirects the console still gets everything, and the summary points at the file.
  CHECK_THAT(r.err, Catch::Contains("[rank1]:rank 1 failing on purpose"));
  CHECK_THAT(r.err, Catch::Contains((dir / "logs1/attempt_0/1/stderr.log").string()));
}

TEST_CASE("redirects keep streams off the console and tee copies them to files", "[e2e][output]") {
  TempDir dir;
  SECTION("--redirects 1: stdout to files only") {
    auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--rdzv_id=rd", "--log_dir", dir.path().string(),
                              "--redirects", "1", e2e::kWorker, "env", "RANK"}));
    REQUIRE(r.status == 0);
    CHECK(e2e::by_rank(r.out).empty());
    CHECK(read_file(dir / "rd/attempt_0/0/stdout.log") == "RANK=0\n");
    CHECK(read_file(dir / "rd/attempt_0/1/stdout.log") == "RANK=1\n");
  }
  SECTION("per-rank map: only rank 1 redirected") {
    auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--rdzv_id=rd", "--log_dir", dir.path().string(),
                              "--redirects", "1:3", e2e::kWorker, "env", "RANK"}));
    REQUIRE(r.status == 0);
    auto ranks = e2e::by_rank(r.out);
    CHECK(ranks.size() == 1);
    CHECK(ranks[0] == std::vector<std::string>{"RANK=0"});
  }
  SECTION("--tee 3 without --log_dir makes a temporary log dir and says where") {
    auto r = run(e2e::ddprun({"--standalone", "--rdzv_id=tee", "--tee", "3", e2e::kWorker, "env", "RANK"}));
    REQUIRE(r.status == 0);
    CHECK(e2e::by_rank(r.out)[0] == std::vector<std::string>{"RANK=0"});
    auto lines = e2e::own_lines(r.err);
    REQUIRE(lines.size() == 1);
    auto at = lines[0].find("logs go to ");
    REQUIRE(at != std::string::npos);
    std::filesystem::path root = lines[0].substr(at + 11);
    CHECK(read_file(root / "attempt_0/0/stdout.log") == "RANK=0\n");
    std::filesystem::remove_all(root.parent_path());
  }
}

TEST_CASE("local_ranks_filter picks the ranks whose output reaches the console", "[e2e][output]") {
  auto r = run(e2e::ddprun({"--nproc_per_node=4", "--standalone", "--local_ranks_filter=1,3", e2e::kWorker, "env",
                            "RANK"}));
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  CHECK(ranks.size() == 2);
  CHECK(ranks[1] == std::vector<std::string>{"RANK=1"});
  CHECK(ranks[3] == std::vector<std::string>{"RANK=3"});
}

TEST_CASE("a last line without a newline still arrives whole", "[e2e][output]") {
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "sh", "-c", "printf 'a\\nb'; printf 'c' >&2"}));
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  CHECK(ranks[0] == std::vector<std::string>{"a", "b"});
  CHECK(ranks[1] == std::vector<std::string>{"a", "b"});
  CHECK(e2e::by_rank(r.err)[0] == std::vector<std::string>{"c"});
}

TEST_CASE("a line a worker already tagged with its rank (PyTorch 2.x) gets one tag, not two", "[e2e][output]") {
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "sh", "-c",
                            "echo \"[rank$RANK]: Traceback\"; echo plain; echo \"[rank$((1 - RANK))]: other\""}));
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("[rank0]: Traceback\n"));
  CHECK_THAT(r.out, Catch::Contains("[rank1]: Traceback\n"));
  CHECK_THAT(r.out, !Catch::Contains("[rank0]:[rank0]:"));
  CHECK_THAT(r.out, Catch::Contains("[rank0]:plain\n"));
  CHECK_THAT(r.out, Catch::Contains("[rank0]:[rank1]: other\n"));  // another rank's tag is the worker's text
}

TEST_CASE("no output is lost when the log dir fills: what the logs miss goes to the console", "[e2e][output]") {
  // 2 ranks x 2 streams x 2,000 lines of about 120 bytes: far more than 64 KiB.
  const long kLines = 2000;
  SmallTmpfs logs("64k");
  TempDir sync;  // where each rank says it is done, so none is stopped before it wrote all
  std::string code = GENERATE("0", "3");
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--rdzv_id=full", "--log_dir", logs.path().string(),
                            "--redirects", "3", e2e::kWorker, "spill", std::to_string(kLines), code,
                            sync.path().string()}),
               {}, 120s);
  CHECK(r.status == std::stoi(code));
  auto console_out = e2e::by_rank(r.out), console_err = e2e::by_rank(r.err);
  std::vector<std::string> errors;  // ddprun's messages about the logs
  for (const auto& line : e2e::own_lines(r.err)) {
    if (line.find("cannot write log file") != std::string::npos) errors.push_back(line);
  }
  INFO(r.err.substr(0, 4000));
  for (int rank = 0; rank < 2; ++rank) {
    for (const char* stream : {"stdout", "stderr"}) {
      std::string path = (logs.path() / ("full/attempt_0/" + std::to_string(rank)) / (std::string(stream) + ".log"));
      INFO(path);
      // The log holds lines 0..k-1 whole (and maybe a piece of line k); the console k..end.
      std::string log = read_file(path);
      std::string piece = log.substr(log.rfind('\n') + 1);
      std::vector<std::string> got = lines_of(log.substr(0, log.size() - piece.size()));
      const auto& console = (stream == std::string("stdout") ? console_out : console_err)[rank];
      REQUIRE_FALSE(console.empty());  // the log did fill up
      CHECK(console.front().rfind(piece, 0) == 0);
      got.insert(got.end(), console.begin(), console.end());
      REQUIRE(got.size() == static_cast<size_t>(kLines));
      for (long i = 0; i < kLines; ++i) {
        if (got[static_cast<size_t>(i)] != numbered_line(rank, i)) FAIL("line " << i << ": " << got[i]);
      }
      // One error line for this stream, naming the file and the error.
      long mentions = 0;
      for (const auto& e : errors) mentions += e.find("'" + path + "'") != std::string::npos;
      CHECK(mentions == 1);
      // The failure summary, or the one line at the end of a job that succeeded, names it.
      if (code == "3") {
        CHECK_THAT(r.err, Catch::Contains("    log incomplete: " + path + " (No space left on device)"));
      } else {
        CHECK_THAT(r.err, Catch::Contains(path + " (No space left on device)"));
      }
    }
  }
  CHECK(errors.size() == 4);
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::StartsWith("ddprun: error: cannot write log file '") &&
                      Catch::Contains("': No space left on device; the log is incomplete"));
  }
  if (code == "0") CHECK_THAT(r.err, Catch::Contains("ddprun: warning: 4 worker log file(s) are incomplete"));
}
