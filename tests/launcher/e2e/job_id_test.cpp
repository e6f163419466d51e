// Job ids end to end: the ids ddprun (--rdzv_id), `ddprun status --run_id` and
// `ddp-rendezvous credential --job` accept are one set. The real ddprun and daemon.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <memory>

#include "e2e.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kRendezvousBin = RENDEZVOUS_BIN;

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// The one line every refused id gets, after the program's prefix.
std::string refusal(const std::string& flag, const std::string& shown) {
  return "invalid " + flag + " '" + shown + "': expected 1 to 128 letters, digits, '.', '_' or '-' (not '.' or '..')";
}

}  // namespace

TEST_CASE("job ids outside letters, digits, '.', '_' and '-' are refused alike by ddprun, status and the daemon",
          "[e2e][job_id]") {
  TempDir dir;
  write_file(dir / "secret", "a-secret\n");
  const std::string secret = (dir / "secret").string();
  auto marker = (dir / "started").string();
  struct Case {
    std::string id, shown;
  };
  const std::vector<Case> bad = {{"a\nb", "a\\x0ab"}, {"with space", "with space"}, {"a/b", "a/b"},
                                 {"tab\there", "tab\\x09here"}, {"..", ".."}, {std::string(129, 'x'), std::string(128, 'x') + "..."},
                                 {"caf\xc3\xa9", "caf\\xc3\\xa9"}};
  for (const auto& c : bad) {
    INFO("id: " << c.shown);
    auto credential = run({kRendezvousBin, "credential", "--job", c.id, "--secret-file", secret}, {}, 10s);
    CHECK(credential.status == 2);
    CHECK(credential.out.empty());
    CHECK(lines_of(credential.err) ==
          std::vector<std::string>{"ddp-rendezvous: error: credential: " + refusal("--job", c.shown)});

    auto launch = run(e2e::ddprun({"--rdzv_id", c.id, e2e::kWorker, "touch", marker}), {}, 10s);
    CHECK(launch.status == 2);
    CHECK(lines_of(launch.err) == std::vector<std::string>{"ddprun: error: " + refusal("--rdzv_id", c.shown)});

    auto status = run(e2e::ddprun({"status", "--run_id", c.id}), {}, 10s);
    CHECK(status.status == 2);
    CHECK(contains(status.err, refusal("--run_id", c.shown)));
  }
  CHECK(!std::filesystem::exists(marker));  // no worker started

  // The longest and most varied id that is valid still makes a credential.
  const std::string good = "Job_7.a-" + std::string(120, 'z');
  auto credential = run({kRendezvousBin, "credential", "--job", good, "--secret-file", secret}, {}, 10s);
  CHECK(credential.status == 0);
  CHECK(lines_of(credential.out).size() == 1);
  CHECK(lines_of(credential.out).at(0).size() == 64);
}
