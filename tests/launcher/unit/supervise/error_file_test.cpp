// Reading the error files PyTorch's @record writes (TORCHELASTIC_ERROR_FILE).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "supervise/error_files.hpp"

using ddprun::parse_worker_error;

TEST_CASE("the error file @record writes gives the exception and its traceback", "[error_file]") {
  const auto e = parse_worker_error(
      R"({"message": {"message": "ValueError: bad \"input\"", "extraInfo": {"py_callstack": )"
      R"("Traceback (most recent call last):\n  File \"t.py\", line 3, in main\n    raise ValueError('bad')\nValueError: bad\n", )"
      R"("timestamp": "1700000000"}}})");
  REQUIRE(e);
  CHECK(e->message == "ValueError: bad \"input\"");
  REQUIRE(e->traceback.size() == 4);
  CHECK(e->traceback.front() == "Traceback (most recent call last):");
  CHECK(e->traceback.back() == "ValueError: bad");
}

TEST_CASE("the plain form and escapes read too", "[error_file]") {
  const auto e = parse_worker_error(R"({"message": "RuntimeError: caf\u00e9\nsecond line", "timestamp": 17, "x": [1, true, null]})");
  REQUIRE(e);
  CHECK(e->message == "RuntimeError: caf\xc3\xa9");  // the first line only
  CHECK(e->traceback.empty());
}

TEST_CASE("anything else is no error file", "[error_file]") {
  CHECK_FALSE(parse_worker_error(""));
  CHECK_FALSE(parse_worker_error("{}"));
  CHECK_FALSE(parse_worker_error("[1, 2]"));
  CHECK_FALSE(parse_worker_error(R"({"message": 3})"));
  CHECK_FALSE(parse_worker_error(R"({"message": "unterminated)"));
  CHECK_FALSE(parse_worker_error(R"({"message": "a"} trailing)"));
  CHECK_FALSE(parse_worker_error(R"({"message": "\u12"})"));
  CHECK_FALSE(parse_worker_error(std::string(100, '[')));  // deeper than any error file: refused, no overflow
  CHECK_FALSE(ddprun::read_worker_error("/no/such/file.json"));
  CHECK_FALSE(ddprun::read_worker_error(""));
}

TEST_CASE("a FIFO, a link or a folder at the error file's path is no error file and never blocks", "[error_file]") {
  char templ[] = "/tmp/ddprun-error-file-XXXXXX";
  REQUIRE(mkdtemp(templ) != nullptr);
  const std::string dir = templ;
  const std::string good = dir + "/good.json", fifo = dir + "/fifo.json", link = dir + "/link.json";
  {
    FILE* f = std::fopen(good.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(R"({"message": "ValueError: x"})", f);
    std::fclose(f);
  }
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);  // nobody ever writes it: a blocking open would hang
  REQUIRE(symlink(good.c_str(), link.c_str()) == 0);
  CHECK(ddprun::read_worker_error(good));
  CHECK_FALSE(ddprun::read_worker_error(fifo));
  CHECK_FALSE(ddprun::read_worker_error(link));
  CHECK_FALSE(ddprun::read_worker_error(dir));
  std::filesystem::remove_all(dir);
}
