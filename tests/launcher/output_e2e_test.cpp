// Worker output through ddprun: whole prefixed lines under heavy concurrent
// output, log files, --redirects, --tee and --local_ranks_filter.
#include <catch2/catch.hpp>

#include "e2e.hpp"

using namespace testing;

TEST_CASE("heavy concurrent output from 4 ranks never splits or mixes a line", "[e2e][output]") {
  const long kLines = 20000;
  auto r = run(e2e::ddprun({"--nproc_per_node=4", "--standalone", e2e::kWorker, "flood", std::to_string(kLines)}),
               {}, 120s);
  REQUIRE(r.status == 0);
  std::map<int, long> next;  // the next line number expected from each rank
  long bad = 0;
  std::string first_bad;  // the first few offending lines, for the failure message
  std::string payload(200, 'x');
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
    std::string expected = "[rank" + std::to_string(rank) + "]:rank=" + std::to_string(rank) + " i=" +
                           std::to_string(i) + " " + payload.substr(0, static_cast<size_t>((i * 37) % 200)) + "|end";
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
