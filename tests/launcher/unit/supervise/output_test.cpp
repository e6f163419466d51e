// Line splitting and per-stream handling of worker output.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "supervise/output.hpp"
#include "supervise/console.hpp"
#include "errors.hpp"
#include "cli/stream_spec.hpp"

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
// A console writing into a pipe, and what came out of it.
struct CapturedConsole {
  int fds[2];
  ddprun::Console* console;  // kept: its thread lives until the process exits
  CapturedConsole() {
    REQUIRE(pipe(fds) == 0);
    console = new ddprun::Console(fds[1]);
  }
  ~CapturedConsole() { close(fds[0]); }
  std::string text() {
    REQUIRE(console->flush(5000));
    std::string out;
    char buf[4096];
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
    return out;
  }
};

// ddprun's own messages (spdlog's default logger), captured while this lives.
struct CapturedLog {
  std::ostringstream text;
  std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  CapturedLog() {
    auto logger = std::make_shared<spdlog::logger>("test", std::make_shared<spdlog::sinks::ostream_sink_st>(text));
    logger->set_pattern("%l: %v");
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(saved); }
};

ddprun::WorkerStream::Options log_only(int log_fd, ddprun::Console* fallback) {
  ddprun::WorkerStream::Options opts;
  opts.prefix = "[rank1]:";
  opts.log_fd = log_fd;
  opts.log_path = "/logs/1/stdout.log";
  opts.label = "rank 1's stdout";
  opts.fallback = fallback;
  return opts;
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
    ddprun::WorkerStream::Options opts;
    opts.prefix = "[rank7]:";
    opts.console = writer;
    opts.log_fd = log[1];
    opts.keep_tail = true;
    ddprun::WorkerStream stream(opts);
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

TEST_CASE("a log that fails sends the stream to the console from the line it failed in", "[output]") {
  signal(SIGPIPE, SIG_IGN);  // as ddprun does: a reader that went away is an error, not death
  CapturedConsole console;
  CapturedLog messages;
  int log[2];
  REQUIRE(pipe(log) == 0);
  ddprun::WorkerStream stream(log_only(log[1], console.console));
  stream.consume("a\nb\nc");
  CHECK_FALSE(stream.log_failure());
  char buf[64];
  CHECK(std::string(buf, static_cast<size_t>(read(log[0], buf, sizeof(buf)))) == "a\nb\nc");
  close(log[0]);  // the next write fails (EPIPE)
  stream.consume("d\ne\n");
  stream.consume("f\n");
  stream.finish();
  REQUIRE(stream.log_failure());
  CHECK(stream.log_failure()->path == "/logs/1/stdout.log");
  CHECK(stream.log_failure()->error == std::strerror(EPIPE));
  // "c" is in the log but not its end of line: the console has that line whole.
  CHECK(console.text() == "[rank1]:cd\n[rank1]:e\n[rank1]:f\n");
  CHECK(messages.text.str() == "error: cannot write log file '/logs/1/stdout.log': " + std::string(strerror(EPIPE)) +
                                   "; the log is incomplete; rank 1's stdout goes to the console from here on\n");
}

TEST_CASE("a short write to the log loses nothing: the cut line goes to the console whole", "[output]") {
  // A file size limit makes the kernel take part of a write, then refuse the rest (EFBIG).
  signal(SIGXFSZ, SIG_IGN);
  char path[] = "/tmp/ddprun-output-test-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  rlimit small = saved;
  small.rlim_cur = 12;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  CapturedConsole console;
  CapturedLog messages;
  {
    ddprun::WorkerStream stream(log_only(fd, console.console));
    stream.consume("0123\n5678\nabcdef\ng");
    stream.finish();
    REQUIRE(stream.log_failure());
    CHECK(stream.log_failure()->error == std::strerror(EFBIG));
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::string logged;
  {
    std::ifstream in(path);
    logged.assign(std::istreambuf_iterator<char>(in), {});
  }
  unlink(path);
  CHECK(logged == "0123\n5678\nab");
  CHECK(console.text() == "[rank1]:abcdef\n[rank1]:g\n");
  CHECK_THAT(messages.text.str(), Catch::Contains("File too large"));
}

TEST_CASE("a stream already on the console only reports its failed log, once", "[output]") {
  CapturedConsole console;
  CapturedLog messages;
  int full = open("/dev/full", O_WRONLY | O_CLOEXEC);  // every write: ENOSPC
  REQUIRE(full >= 0);
  auto opts = log_only(full, console.console);
  opts.console = console.console;
  ddprun::WorkerStream stream(opts);
  stream.consume("x\ny");
  stream.consume("z\n");
  stream.finish();
  REQUIRE(stream.log_failure());
  CHECK(stream.log_failure()->error == "No space left on device");
  CHECK(console.text() == "[rank1]:x\n[rank1]:yz\n");
  CHECK(messages.text.str() == "error: cannot write log file '/logs/1/stdout.log': No space left on device; the log "
                               "is incomplete; rank 1's stdout is on the console\n");
}

TEST_CASE("a line that already carries its rank's prefix gets no second one", "[output]") {
  int console[2];
  REQUIRE(pipe(console) == 0);
  auto* writer = new ddprun::Console(console[1]);  // kept: its thread lives until the process exits
  {
    ddprun::WorkerStream::Options opts;
    opts.prefix = "[rank1]:";
    opts.console = writer;
    ddprun::WorkerStream stream(opts);
    // PyTorch 2.x writes "[rankN]: " itself on some lines; another rank's tag is text.
    stream.consume("[rank1]: Traceback (most recent call last):\n[rank0]: quoted\nplain\n[rank1]:\n");
    stream.finish();
  }
  REQUIRE(writer->flush(5000));
  char buf[256];
  ssize_t n = read(console[0], buf, sizeof(buf));
  CHECK(std::string(buf, static_cast<size_t>(n)) ==
        "[rank1]: Traceback (most recent call last):\n[rank1]:[rank0]: quoted\n[rank1]:plain\n[rank1]:\n");
  close(console[0]);
}
