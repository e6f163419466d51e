// The one way to wait (rdzv/waiting.hpp): slices and their budgets, notices naming
// what is missing, the timeout after at least one try, cancellation, and the pause
// after a try that fails at once.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <thread>

#include "rdzv/waiting.hpp"

using namespace std::chrono_literals;
using rdzv::Millis;
using rdzv::WaitEnd;
using rdzv::Waiting;
using Clock = std::chrono::steady_clock;

namespace {
// A try that blocks its whole budget and never succeeds, remembering the budgets.
auto sleeper(std::vector<Millis>& budgets) {
  return [&budgets](Millis budget) {
    budgets.push_back(budget);
    std::this_thread::sleep_for(budget);
    return false;
  };
}
}  // namespace

TEST_CASE("a wait ends when a try succeeds, and tries at least once with a zero timeout", "[waiting]") {
  Waiting w;
  w.timeout = 0ms;
  int tries = 0;
  CHECK(rdzv::wait_in_slices(w, [&](Millis budget) {
          CHECK(budget == 0ms);
          return ++tries == 1;
        }) == WaitEnd::kArrived);
  w.timeout = 10s;
  tries = 0;
  CHECK(rdzv::wait_in_slices(w, [&](Millis) { return ++tries == 3; }) == WaitEnd::kArrived);
  CHECK(tries == 3);
}

TEST_CASE("budgets are bounded by the slice, the time left and the next notice", "[waiting]") {
  std::vector<Millis> budgets;
  std::vector<std::string> said;
  Waiting w;
  w.timeout = 700ms;
  w.slice = 300ms;
  w.notice_every = 250ms;
  w.describe = [] { return "rank 0 still waiting for rank 1"; };
  w.say = [&](const std::string& line) { said.push_back(line); };
  const auto start = Clock::now();
  CHECK(rdzv::wait_in_slices(w, sleeper(budgets)) == WaitEnd::kTimedOut);
  const auto took = Clock::now() - start;
  CHECK(took >= 700ms);
  CHECK(took < 3s);
  REQUIRE(budgets.size() >= 3);
  CHECK(budgets[0] <= 250ms);  // the first notice comes first
  for (const auto b : budgets) CHECK(b <= 300ms);
  REQUIRE(!said.empty());  // at 250 and 500 ms; the timeout ends it before 750
  CHECK(said.size() <= 2);
  CHECK(said[0] == "rank 0 still waiting for rank 1 (0 s of 1 s)");
}

TEST_CASE("notices say what is missing when each is due, and how long so far", "[waiting]") {
  std::vector<std::string> said;
  int missing = 3;
  Waiting w;
  w.timeout = 2600ms;
  w.notice_every = 1s;
  w.describe = [&] { return "waiting for " + std::to_string(missing) + " ranks"; };
  w.say = [&](const std::string& line) { said.push_back(line); };
  std::vector<Millis> budgets;
  auto try_once = sleeper(budgets);
  CHECK(rdzv::wait_in_slices(w, [&](Millis budget) {
          try_once(budget);
          --missing;
          return false;
        }) == WaitEnd::kTimedOut);
  REQUIRE(said.size() == 2);
  CHECK_THAT(said[0], Catch::Matches(R"(waiting for 2 ranks \(\d s of 3 s\))"));
  CHECK_THAT(said[1], Catch::Matches(R"(waiting for 1 ranks \(\d s of 3 s\))"));
  // Without a timeout a notice says only how long so far; with notice_every 0, none.
  said.clear();
  w.timeout = Millis::max();
  int tries = 0;
  CHECK(rdzv::wait_in_slices(w, [&](Millis budget) {
          std::this_thread::sleep_for(budget);
          return ++tries == 2;
        }) == WaitEnd::kArrived);
  REQUIRE(said.size() == 1);
  CHECK_THAT(said[0], Catch::Matches(R"(waiting for 0 ranks \(\d s\))"));
  said.clear();
  w.notice_every = 0ms;
  w.timeout = 300ms;
  w.slice = 100ms;
  CHECK(rdzv::wait_in_slices(w, sleeper(budgets)) == WaitEnd::kTimedOut);
  CHECK(said.empty());
}

TEST_CASE("a cancelled wait ends before its next try", "[waiting]") {
  int tries = 0;
  Waiting w;
  w.timeout = 10s;
  w.slice = 10ms;
  w.cancelled = [&] { return tries == 4; };
  CHECK(rdzv::wait_in_slices(w, [&](Millis budget) {
          ++tries;
          std::this_thread::sleep_for(budget);
          return false;
        }) == WaitEnd::kCancelled);
  CHECK(tries == 4);
}

TEST_CASE("a try that fails at once is followed by the retry pause, and its exception ends the wait", "[waiting]") {
  int tries = 0;
  Waiting w;
  w.timeout = 500ms;
  w.retry_pause = 100ms;
  CHECK(rdzv::wait_in_slices(w, [&](Millis) {
          ++tries;
          return false;
        }) == WaitEnd::kTimedOut);
  CHECK(tries >= 2);  // without the pause: thousands
  CHECK(tries <= 6);
  CHECK_THROWS_WITH(rdzv::wait_in_slices(w, [](Millis) -> bool { throw std::runtime_error("refused"); }),
                    "refused");
}
