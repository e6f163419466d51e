// Worker line prefixes (--log_line_prefix_template) and the filtered copies of
// --duplicate_*_filters, in process.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <memory>

#include "supervise/console.hpp"
#include "supervise/line_prefix.hpp"
#include "supervise/output.hpp"
#include "subprocess.hpp"

using ddprun::line_prefix;

namespace {
const ddprun::LinePrefixFields kFields{12, 3, "trainer", "r12i0n8"};
}

TEST_CASE("without a template the prefix is the rank in brackets and is not doubled", "[output][prefix]") {
  auto p = line_prefix(std::nullopt, kFields);
  CHECK(p.text == "[rank12]:");
  CHECK(p.skip_when_present);
}

TEST_CASE("a template fills torchrun's fields and the host name as string.Template does", "[output][prefix]") {
  CHECK(line_prefix("${hostname}:${rank}: ", kFields).text == "r12i0n8:12: ");
  CHECK(line_prefix("[${role_name}${local_rank}]:", kFields).text == "[trainer3]:");
  CHECK(line_prefix("$rank|$local_rank|$role_name", kFields).text == "12|3|trainer");
  // safe_substitute: unknown names, unclosed braces and a lone '$' stay; "$$" is '$'.
  CHECK(line_prefix("${nope} $nope ${rank $ $$rank", kFields).text == "${nope} $nope ${rank $ $rank");
  CHECK(line_prefix("$ranks", kFields).text == "$ranks");  // the identifier is "ranks"
  CHECK_FALSE(line_prefix("${rank}", kFields).skip_when_present);
}

TEST_CASE("lines holding a filter string also go prefixed to the filtered log", "[output][duplicate]") {
  testing::TempDir dir;
  int console[2];
  REQUIRE(pipe(console) == 0);
  auto* writer = new ddprun::Console(console[1]);  // kept: its thread lives until the process exits
  auto filtered = std::make_shared<ddprun::FilteredLog>((dir / "filtered_stdout.log").string());
  for (int rank : {0, 1}) {
    ddprun::WorkerStream::Options opts;
    opts.prefix = "h:" + std::to_string(rank) + ": ";
    opts.skip_present_prefix = false;
    opts.console = rank == 0 ? writer : nullptr;  // rank 1 is off the console: its lines are still filtered
    opts.duplicate = filtered;
    opts.filters = {"loss", "a,b"};
    ddprun::WorkerStream stream(opts);
    stream.consume("step 1 loss=3\nnoise\nsaw a,b here\n");
    stream.finish();
  }
  REQUIRE(writer->flush(5000));
  char buf[256];
  ssize_t n = read(console[0], buf, sizeof(buf));
  CHECK(std::string(buf, static_cast<size_t>(n)) == "h:0: step 1 loss=3\nh:0: noise\nh:0: saw a,b here\n");
  close(console[0]);
  CHECK(testing::read_file(dir / "filtered_stdout.log") ==
        "h:0: step 1 loss=3\nh:0: saw a,b here\nh:1: step 1 loss=3\nh:1: saw a,b here\n");
}

TEST_CASE("a filtered log that cannot be created is a LaunchError naming it", "[output][duplicate]") {
  CHECK_THROWS_WITH(ddprun::FilteredLog("/no/such/dir/filtered_stderr.log"),
                    Catch::Contains("'/no/such/dir/filtered_stderr.log'"));
}
