// The stall report's cross-rank analysis: a pure function of the progress records.
#include <catch2/catch.hpp>

#include "stall_report.hpp"

using ddp::contract::GroupProgress;
using ddp::contract::OpSummary;
using ddp::contract::ProgressRecord;
using ddprun::ProgressRecords;

namespace {

constexpr int64_t kT0 = 1'800'000'000'000;

// Rank `rank` of a world of `size` in group "0": completed `done` all_reduces, and
// waits in the next one (state `state`) unless `state` is empty.
ProgressRecord rank_at(int rank, int size, uint64_t done, const std::string& state) {
  ProgressRecord r;
  r.rank = rank;
  r.pid = 100 + rank;
  r.host = "h";
  GroupProgress g;
  g.group = "0";
  g.rank = rank;
  g.size = size;
  g.issued = g.completed = done;
  if (done > 0) g.current = g.last_completed = OpSummary{done, "all_reduce 8×f32 sum", "completed", kT0 + 10};
  if (!state.empty()) {
    g.issued = done + 1;
    g.current = OpSummary{done + 1, "all_reduce 8×f32 sum", state, kT0 + 20};
  }
  r.groups.push_back(g);
  return r;
}

}  // namespace

TEST_CASE("the analysis names the rank that never arrived and the ones that wait", "[stall]") {
  ProgressRecords recs = {rank_at(0, 3, 4, "started"), rank_at(1, 3, 4, ""), rank_at(2, 3, 4, "started")};
  CHECK(ddprun::any_rank_waiting(recs));
  CHECK_FALSE(ddprun::any_call_failed(recs));
  CHECK(ddprun::progress_signature(recs) == 12);
  CHECK(ddprun::last_completion_ms(recs) == kT0 + 10);
  auto a = ddprun::analyse_stall(recs, kT0 + 30'020);
  CHECK(a.headline == "rank 1 never arrived at all_reduce #5 of group 0, which ranks 0,2 wait in");
  CHECK(a.stalled == std::vector<int>{1});
  CHECK_THAT(a.text, Catch::Contains("rank 0 waits in all_reduce #5 of group 0 (all_reduce 8×f32 sum, started)") &&
                         Catch::Contains(", 30.0 s\n") &&
                         Catch::Contains("rank 1 never arrived; last completed all_reduce #4 of group 0"));
}

TEST_CASE("ranks without a record are named and a failed call is seen", "[stall]") {
  ProgressRecords recs = {rank_at(0, 2, 0, "failed"), std::nullopt};
  CHECK(ddprun::any_call_failed(recs));
  auto a = ddprun::analyse_stall(recs, kT0 + 1000);
  CHECK(a.headline == "rank 1 never arrived at all_reduce #1 of group 0, which rank 0 waits in");
  CHECK_THAT(a.text, Catch::Contains("1 member(s) published no progress record (ranks 1)") &&
                         Catch::Contains("failed) since"));
}

TEST_CASE("with every rank arrived the waiting ranks are the stalled ones, and no record at all says so", "[stall]") {
  ProgressRecords recs = {rank_at(0, 2, 2, "started"), rank_at(1, 2, 2, "started")};
  auto a = ddprun::analyse_stall(recs, kT0);
  CHECK(a.headline == "ranks 0,1 wait in all_reduce #3 of group 0 and it does not complete");
  CHECK(a.stalled == std::vector<int>{0, 1});
  auto none = ddprun::analyse_stall(ProgressRecords(2), kT0);
  CHECK_THAT(none.text, Catch::Contains("no rank published a progress record"));
  CHECK_FALSE(ddprun::any_rank_waiting(ProgressRecords(2)));
}
