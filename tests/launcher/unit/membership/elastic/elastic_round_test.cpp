// The elastic closing rule (elastic_round.hpp) without a store: each branch of
// decide_round over hand-made snapshots, and the round records' bytes.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "membership/elastic/elastic_round.hpp"

using namespace ddprun::elastic;
using namespace std::chrono_literals;

namespace {

RoundView view(int min, int max, std::vector<Candidate> joined) {
  RoundView v;
  v.min_nodes = min;
  v.max_nodes = max;
  v.joined = std::move(joined);
  v.last_call = 30s;
  v.join_timeout = 60s;
  return v;
}

std::vector<int64_t> ids(const RoundDecision& d) {
  std::vector<int64_t> out;
  for (const auto& c : d.members) out.push_back(c.id);
  return out;
}

}  // namespace

TEST_CASE("the first attempt closes at MAX at once, ordered by hint then id", "[elastic]") {
  const auto t0 = Clock::now();
  RoundTimers timers(t0);
  auto d = decide_round(view(2, 3, {{1, kNoHint}, {2, 1}, {3, 0}}), timers, t0);
  REQUIRE(d.action == RoundAction::kClose);
  CHECK(ids(d) == std::vector<int64_t>{3, 2, 1});  // hints 0, 1, then no hint
  CHECK(d.present == 3);
}

TEST_CASE("the first attempt closes at MIN only after last_call since the MIN-th joined", "[elastic]") {
  const auto t0 = Clock::now();
  RoundTimers timers(t0);
  auto v = view(2, 3, {{1, kNoHint}});
  CHECK(decide_round(v, timers, t0).action == RoundAction::kWait);
  v.joined.push_back({2, kNoHint});
  CHECK(decide_round(v, timers, t0 + 5s).action == RoundAction::kWait);  // MIN reached at t0+5s
  CHECK(decide_round(v, timers, t0 + 34s).action == RoundAction::kWait);
  auto d = decide_round(v, timers, t0 + 35s);
  REQUIRE(d.action == RoundAction::kClose);
  CHECK(ids(d) == std::vector<int64_t>{1, 2});
}

TEST_CASE("falling below MIN restarts the last call and, after join_timeout, gives up", "[elastic]") {
  const auto t0 = Clock::now();
  RoundTimers timers(t0);
  auto v = view(2, 3, {{1, kNoHint}, {2, kNoHint}});
  CHECK(decide_round(v, timers, t0).action == RoundAction::kWait);
  v.lost = {2};
  CHECK(decide_round(v, timers, t0 + 40s).action == RoundAction::kWait);  // below MIN since t0+40s
  CHECK(decide_round(v, timers, t0 + 99s).action == RoundAction::kWait);
  auto d = decide_round(v, timers, t0 + 100s);
  CHECK(d.action == RoundAction::kGiveUp);
  CHECK(d.present == 1);
}

TEST_CASE("a later attempt closes as soon as every stayer is back, lost ones not waited for", "[elastic]") {
  const auto t0 = Clock::now();
  RoundTimers timers(t0);
  auto v = view(2, 4, {{5, kNoHint}, {3, kNoHint}});
  v.previous = std::vector<int64_t>{3, 5, 7};
  CHECK(decide_round(v, timers, t0).action == RoundAction::kWait);  // 7 neither back nor lost
  v.lost = {7};
  auto d = decide_round(v, timers, t0 + 10ms);
  REQUIRE(d.action == RoundAction::kClose);
  CHECK(ids(d) == std::vector<int64_t>{3, 5});  // relative order kept

  // A newcomer that joined in time is included; duplicates in joined count once.
  RoundTimers later(t0);
  v.joined = {{5, kNoHint}, {3, kNoHint}, {9, kNoHint}, {5, kNoHint}};
  d = decide_round(v, later, t0);
  REQUIRE(d.action == RoundAction::kClose);
  CHECK(ids(d) == std::vector<int64_t>{3, 5, 9});
}

TEST_CASE("a stayer that neither comes back nor is lost is waited for at most join_timeout", "[elastic]") {
  const auto t0 = Clock::now();
  RoundTimers timers(t0);
  auto v = view(2, 4, {{1, kNoHint}, {2, kNoHint}});
  v.previous = std::vector<int64_t>{1, 2, 3};
  CHECK(decide_round(v, timers, t0).action == RoundAction::kWait);
  CHECK(decide_round(v, timers, t0 + 59s).action == RoundAction::kWait);
  CHECK(decide_round(v, timers, t0 + 60s).action == RoundAction::kClose);
}

TEST_CASE("more than MAX present: the stayers first, then the earliest newcomers", "[elastic]") {
  const auto t0 = Clock::now();
  RoundTimers timers(t0);
  auto v = view(1, 3, {{9, 0}, {8, kNoHint}, {2, kNoHint}, {4, kNoHint}});
  v.previous = std::vector<int64_t>{2, 4};
  auto d = decide_round(v, timers, t0);
  REQUIRE(d.action == RoundAction::kClose);
  CHECK(ids(d) == std::vector<int64_t>{2, 4, 8});  // 9 has the smallest hint but came last
}

TEST_CASE("at MAX, a re-forming attempt still waits for its stayers before newcomers fill it", "[elastic]") {
  const auto t0 = Clock::now();
  RoundTimers timers(t0);
  // Stayer 2 is on its way back (not lost); newcomers 5 and 6 queued meanwhile.
  auto v = view(1, 3, {{1, kNoHint}, {5, kNoHint}, {6, kNoHint}});
  v.previous = std::vector<int64_t>{1, 2};
  CHECK(decide_round(v, timers, t0).action == RoundAction::kWait);
  CHECK(decide_round(v, timers, t0 + 59s).action == RoundAction::kWait);
  v.joined.push_back({2, kNoHint});
  auto d = decide_round(v, timers, t0 + 59s);
  REQUIRE(d.action == RoundAction::kClose);
  CHECK(ids(d) == std::vector<int64_t>{1, 2, 5});
  SECTION("a stayer neither back nor lost is given up after join_timeout") {
    v.joined.pop_back();
    d = decide_round(v, timers, t0 + 60s);
    REQUIRE(d.action == RoundAction::kClose);
    CHECK(ids(d) == std::vector<int64_t>{1, 5, 6});
  }
}

TEST_CASE("while the previous attempt runs, a newcomer only waits", "[elastic]") {
  const auto t0 = Clock::now();
  RoundTimers timers(t0);
  auto v = view(2, 3, {{7, kNoHint}});
  v.previous = std::vector<int64_t>{1, 2, 3};
  v.previous_running = true;
  CHECK(decide_round(v, timers, t0 + 1000s).action == RoundAction::kWait);  // never gives up the job
  v.joined = {{7, kNoHint}, {1, kNoHint}, {2, kNoHint}, {3, kNoHint}};
  CHECK(decide_round(v, timers, t0 + 1000s).action == RoundAction::kWait);  // nor closes it
}

TEST_CASE("round records read back, and bad bytes are refused with a reason", "[elastic]") {
  Registration r{"hosta", "10.0.0.2", 4, kNoHint, 29500};
  auto back = Registration::decode(r.encode());
  CHECK(back.host == "hosta");
  CHECK(back.address == "10.0.0.2");
  CHECK(back.nproc == 4);
  CHECK(back.hint == kNoHint);
  CHECK(back.port == 29500);
  CHECK_THROWS_AS(Registration::decode("hosta\n10.0.0.2\n0\n1\n2"), std::invalid_argument);
  CHECK_THROWS_AS(Registration::decode("hosta\n10.0.0.2\n1\n1\n70000"), std::invalid_argument);
  CHECK_THROWS_AS(Registration::decode("hosta"), std::invalid_argument);

  MemberList m{2, {4, 1, 9}};
  auto list = MemberList::decode(m.encode());
  CHECK(list.restart_count == 2);
  CHECK(list.ids == std::vector<int64_t>{4, 1, 9});
  CHECK(list.rank_of(9) == 2);
  CHECK(list.rank_of(5) == -1);
  CHECK_THROWS_AS(MemberList::decode("2\n"), std::invalid_argument);
  CHECK_THROWS_AS(MemberList::decode("x\n1 2"), std::invalid_argument);
  CHECK_THROWS_AS(MemberList::decode("1\n1 two"), std::invalid_argument);

  CHECK(decode_joined("3\n1\n3\n2\n") == std::vector<int64_t>{3, 1, 2});
  CHECK(decode_joined("").empty());
  CHECK_THROWS_AS(decode_joined("3\n\x01\n"), std::invalid_argument);

  auto end = JobEnd::decode(JobEnd{3, "why\nmore"}.encode());
  CHECK(end.status == 3);
  CHECK(end.why == "why\nmore");
  CHECK_THROWS_AS(JobEnd::decode("300\nx"), std::invalid_argument);
}
