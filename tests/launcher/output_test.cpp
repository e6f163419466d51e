// Line splitting and per-stream handling of worker output.
#include <catch2/catch.hpp>
#include <unistd.h>

#include "output.hpp"
#include "console.hpp"
#include "errors.hpp"
#include "stream_spec.hpp"

using ddprun::LineSplitter;

namespace {
std::vector<std::string> split_all(const std::vector<std::string>& chunks, bool finish = true) {
  LineSplitter s;
  std::vector<std::string> lines;
  auto take = [&](std::string_view line) { lines.emplace_back(line); };
  for (const auto& c : chunks) s.feed(c, take);
  if (finish) s.finish(take);
  return lines;
}
}  // namespace

TEST_CASE("lines are whole however the bytes arrive", "[output]") {
  CHECK(split_all({"a\nb\n"}) == std::vector<std::string>{"a", "b"});
  CHECK(split_all({"he", "llo\nwo", "rld\n"}) == std::vector<std::string>{"hello", "world"});
  CHECK(split_all({"\n\n"}) == std::vector<std::string>{"", ""});
  CHECK(split_all({"no newline at end"}) == std::vector<std::string>{"no newline at end"});
  CHECK(split_all({"partial"}, false).empty());
  CHECK(split_all({}).empty());
}

TEST_CASE("an endless line is cut at the limit instead of growing without bound", "[output]") {
  std::string big(LineSplitter::kMaxLine + 10, 'x');
  auto lines = split_all({big.substr(0, 1000), big.substr(1000), "\n"});
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].size() == LineSplitter::kMaxLine);
  CHECK(lines[1].size() == 10);
}

TEST_CASE("the tail keeps the last lines truncated", "[output]") {
  ddprun::TailBuffer tail;
  for (int i = 0; i < 25; ++i) tail.push("line " + std::to_string(i));
  tail.push(std::string(1000, 'y'));
  REQUIRE(tail.lines().size() == ddprun::TailBuffer::kLines);
  CHECK(tail.lines().front() == "line 16");
  CHECK(tail.lines().back().size() == ddprun::TailBuffer::kLineChars);
}

TEST_CASE("a worker stream prefixes console lines and logs raw bytes", "[output]") {
  int console[2], log[2];
  REQUIRE(pipe(console) == 0);
  REQUIRE(pipe(log) == 0);
  auto* writer = new ddprun::Console(console[1]);  // kept: its thread lives until the process exits
  {
    ddprun::WorkerStream stream({"[rank7]:", writer, log[1], true});
    stream.consume("one\ntw");
    stream.consume("o\nthree");
    stream.finish();
    CHECK(stream.tail().lines() == std::deque<std::string>{"one", "two", "three"});
  }  // closes the log fd
  REQUIRE(writer->flush(5000));
  char buf[256];
  ssize_t n = read(console[0], buf, sizeof(buf));
  CHECK(std::string(buf, static_cast<size_t>(n)) == "[rank7]:one\n[rank7]:two\n[rank7]:three\n");
  n = read(log[0], buf, sizeof(buf));
  CHECK(std::string(buf, static_cast<size_t>(n)) == "one\ntwo\nthree");
  close(console[0]);
  close(log[0]);
}

TEST_CASE("stream specs: one value for all ranks or a per-rank map", "[output]") {
  auto all = ddprun::StreamSpec::parse("--redirects", "2");
  CHECK(all.for_rank(0) == ddprun::kStderr);
  CHECK(all.for_rank(99) == ddprun::kStderr);
  CHECK(all.max_rank() == -1);
  auto map = ddprun::StreamSpec::parse("--tee", "1:3,4:1");
  CHECK(map.for_rank(0) == ddprun::kNoStream);
  CHECK(map.for_rank(1) == ddprun::kBothStreams);
  CHECK(map.max_rank() == 4);
  CHECK_FALSE(ddprun::StreamSpec::parse("--tee", "0").any());
  CHECK_FALSE(ddprun::StreamSpec::parse("--tee", "0:0").any());
  CHECK_THROWS_AS(ddprun::StreamSpec::parse("--tee", "1:"), ddprun::UsageError);
  CHECK_THROWS_AS(ddprun::StreamSpec::parse("--tee", ":1"), ddprun::UsageError);
  CHECK_THROWS_AS(ddprun::StreamSpec::parse("--tee", ""), ddprun::UsageError);
}
