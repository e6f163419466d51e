// The wait-for graph of a stalled job: blocked sends and recvs with their peers, and
// cycles through them and through collectives (a pure function of the records).
#include <catch2/catch.hpp>

#include "diagnose/stall_report.hpp"
#include "diagnose/wait_graph.hpp"

using ddp::contract::GroupProgress;
using ddp::contract::OpSummary;
using ddp::contract::PeerCall;
using ddp::contract::ProgressRecord;
using ddprun::ProgressRecords;

namespace {

constexpr int64_t kT0 = 1'800'000'000'000;

// Rank `rank` of a world of `size`: completed one all_reduce; `barrier`: waits in
// barrier #2 of group 0 (else it issued nothing more).
ProgressRecord world_rank(int rank, int size, bool barrier = false) {
  ProgressRecord r;
  r.rank = rank;
  r.host = "h";
  GroupProgress g;
  g.group = "0";
  g.rank = rank;
  g.size = size;
  g.issued = g.completed = 1;
  g.current = g.last_completed = OpSummary{1, "all_reduce 4×f32 sum", "completed", kT0};
  if (barrier) {
    g.issued = 2;
    g.current = OpSummary{2, "barrier", "started", kT0 + 100};
  }
  r.groups.push_back(g);
  return r;
}

void recv_from(ProgressRecord& r, int peer, uint64_t seq = 1, size_t group = 0) {
  r.groups[group].p2p_pending.push_back(
      PeerCall{OpSummary{seq, "recv 4×f32 from " + std::to_string(peer), "started", kT0 + 200}, peer});
}

void send_to(ProgressRecord& r, int peer, uint64_t seq = 1) {
  r.groups[0].p2p_pending.push_back(
      PeerCall{OpSummary{seq, "send 4×f32 to " + std::to_string(peer), "started", kT0 + 200}, peer});
}

}  // namespace

TEST_CASE("two ranks that recv from each other are a deadlock", "[stall]") {
  ProgressRecords recs = {world_rank(0, 2), world_rank(1, 2)};
  recv_from(*recs[0], 1);
  recv_from(*recs[1], 0);
  CHECK(ddprun::any_rank_waiting(recs));
  const auto w = ddprun::analyse_waits(recs, kT0 + 4'200);
  CHECK(w.headline == "rank 0 waits in recv #1 from rank 1, which waits in recv #1 from rank 0: a deadlock");
  CHECK(w.culprits == std::vector<int>{0, 1});
  CHECK_THAT(w.text, Catch::Contains("rank 0 waits in recv #1 from rank 1 (recv 4×f32 from 1, started) since") &&
                         Catch::Contains(", 4.0 s\n") && Catch::Contains("rank 1 waits in recv #1 from rank 0"));
  // The whole report leads with it.
  const auto a = ddprun::analyse_stall(recs, kT0 + 4'200);
  CHECK(a.headline == w.headline);
  CHECK(a.stalled == std::vector<int>{0, 1});
  const auto in_flight = ddprun::in_flight_call(recs, 1);
  REQUIRE(in_flight);
  CHECK(in_flight->name == "recv #1 from rank 0");
}

TEST_CASE("a barrier that waits for ranks blocked in recv says so and the cycle is theirs", "[stall]") {
  ProgressRecords recs = {world_rank(0, 3), world_rank(1, 3), world_rank(2, 3, true)};
  recv_from(*recs[0], 1);
  recv_from(*recs[1], 0);
  const auto a = ddprun::analyse_stall(recs, kT0 + 5'000);
  CHECK(a.headline == "rank 0 waits in recv #1 from rank 1, which waits in recv #1 from rank 0: a deadlock");
  CHECK_THAT(a.text, Catch::Contains("rank 0 never arrived; last completed all_reduce #1 of group 0") &&
                         Catch::Contains("rank 2 waits in barrier #2 of group 0 for ranks 0,1: rank 0 is blocked in "
                                         "recv #1 from rank 1; rank 1 is blocked in recv #1 from rank 0"));
  const auto in_flight = ddprun::in_flight_call(recs, 2);
  REQUIRE(in_flight);
  CHECK(in_flight->name == "barrier #2 of group 0");
}

TEST_CASE("a cycle through a collective and a recv is named with whom the collective waits for", "[stall]") {
  // Rank 0 waits in the barrier for rank 1, which waits in a recv from rank 0.
  ProgressRecords recs = {world_rank(0, 2, true), world_rank(1, 2)};
  recv_from(*recs[1], 0);
  const auto w = ddprun::analyse_waits(recs, kT0 + 1'000);
  CHECK(w.headline ==
        "rank 0 waits in barrier #2 of group 0 for rank 1, which waits in recv #1 from rank 0: a deadlock");
}

TEST_CASE("a recv from a rank in no call names that rank and no deadlock", "[stall]") {
  ProgressRecords recs = {world_rank(0, 2), world_rank(1, 2)};
  recv_from(*recs[0], 1, 3);
  const auto a = ddprun::analyse_stall(recs, kT0 + 1'000);
  CHECK(a.headline == "rank 0 waits in recv #3 from rank 1, and rank 1 waits in no call");
  CHECK(a.stalled == std::vector<int>{1});
  CHECK_THAT(a.text, !Catch::Contains("deadlock"));
}

TEST_CASE("sends and recvs of a subgroup name global ranks", "[stall]") {
  // Group 0.0 holds global ranks 2 and 3 (group ranks 0 and 1).
  ProgressRecords recs = {world_rank(0, 4), world_rank(1, 4), world_rank(2, 4), world_rank(3, 4)};
  for (int r : {2, 3}) {
    GroupProgress sub;
    sub.group = "0.0";
    sub.rank = r - 2;
    sub.size = 2;
    recs[r]->groups.push_back(sub);
  }
  recv_from(*recs[2], 1, 1, 1);
  recv_from(*recs[3], 0, 1, 1);
  const auto w = ddprun::analyse_waits(recs, kT0 + 1'000);
  CHECK(w.headline ==
        "rank 2 waits in recv #1 from rank 3 of group 0.0, which waits in recv #1 from rank 2 of group 0.0: a deadlock");
}

TEST_CASE("completed sends and recvs count as progress", "[stall]") {
  ProgressRecords recs = {world_rank(0, 2), world_rank(1, 2)};
  const auto before = ddprun::progress_signature(recs);
  recs[0]->groups[0].p2p_completed = 1;
  recs[0]->groups[0].p2p_done_ms = kT0 + 500;
  CHECK(ddprun::progress_signature(recs) != before);
  CHECK(ddprun::last_completion_ms(recs) == kT0 + 500);
  CHECK_FALSE(ddprun::any_rank_waiting(recs));
}

TEST_CASE("a send whose peer waits in the matching recv is a transfer in flight, not a deadlock", "[stall]") {
  ProgressRecords recs = {world_rank(0, 2), world_rank(1, 2)};
  send_to(*recs[0], 1);
  recv_from(*recs[1], 0);
  const auto w = ddprun::analyse_waits(recs, kT0 + 4'000);
  const std::string line = "the transfer between rank 0 (send #1) and rank 1 (recv #1) is in flight and does not complete";
  CHECK(w.headline == line);
  CHECK(w.culprits == std::vector<int>{0, 1});
  CHECK_THAT(w.text, Catch::Contains("    " + line + "\n") && !Catch::Contains("deadlock"));
  CHECK(ddprun::analyse_stall(recs, kT0 + 4'000).headline == line);

  // Numbers count per peer and direction: send #2 does not match recv #1.
  ProgressRecords off = {world_rank(0, 2), world_rank(1, 2)};
  send_to(*off[0], 1, 2);
  recv_from(*off[1], 0, 1);
  CHECK_THAT(ddprun::analyse_waits(off, kT0 + 4'000).headline, Catch::EndsWith(": a deadlock"));
}

TEST_CASE("two ranks that send to each other over full buffers are a deadlock", "[stall]") {
  ProgressRecords recs = {world_rank(0, 2), world_rank(1, 2)};
  send_to(*recs[0], 1);
  send_to(*recs[1], 0);
  const auto w = ddprun::analyse_waits(recs, kT0 + 4'000);
  CHECK(w.headline == "rank 0 waits in send #1 to rank 1, which waits in send #1 to rank 0: a deadlock");
  CHECK(w.culprits == std::vector<int>{0, 1});
  CHECK_THAT(w.text, !Catch::Contains("transfer"));
}

TEST_CASE("a recv posted async before a barrier of another group waits for nobody", "[stall]") {
  // Group 0.0 holds global ranks 0 and 2. Rank 0 posted an async recv from rank 1 and
  // then entered barrier #1 of group 0.0, which waits for rank 2; rank 1 waits in a
  // recv from rank 0. Rank 0 would send after the barrier: no cycle 0 <-> 1.
  ProgressRecords recs = {world_rank(0, 3), world_rank(1, 3), world_rank(2, 3)};
  for (int r : {0, 2}) {
    GroupProgress sub;
    sub.group = "0.0";
    sub.rank = r / 2;
    sub.size = 2;
    recs[r]->groups.push_back(sub);
  }
  auto& barrier = recs[0]->groups[1];
  barrier.issued = 1;
  barrier.current = OpSummary{1, "barrier", "started", kT0 + 300};
  recv_from(*recs[0], 1);
  recv_from(*recs[1], 0);
  const auto w = ddprun::analyse_waits(recs, kT0 + 4'000);
  CHECK_THAT(w.headline, !Catch::Contains("deadlock"));
  CHECK(w.headline == "rank 1 waits in recv #1 from rank 0 and it does not complete");
  CHECK(w.culprits.empty());
  CHECK_THAT(w.text, Catch::Contains("rank 0 has pending recv #1 from rank 1 (") &&
                         Catch::Contains("rank 1 waits in recv #1 from rank 0 ("));
  const auto in_flight = ddprun::in_flight_call(recs, 0);
  REQUIRE(in_flight);
  CHECK(in_flight->name == "barrier #1 of group 0.0");

  // The same recv in the barrier's own group holds the barrier queued behind it: the
  // rank waits in the recv, and that is a cycle.
  ProgressRecords same = {world_rank(0, 2), world_rank(1, 2)};
  same[0]->groups[0].issued = 2;
  same[0]->groups[0].current = OpSummary{2, "barrier", "queued", kT0 + 300};
  recv_from(*same[0], 1);
  recv_from(*same[1], 0);
  CHECK(ddprun::analyse_waits(same, kT0 + 4'000).headline ==
        "rank 0 waits in recv #1 from rank 1, which waits in recv #1 from rank 0: a deadlock");
  CHECK(ddprun::in_flight_call(same, 0)->name == "recv #1 from rank 1");
}

TEST_CASE("a recv from a rank that published no record says so", "[stall]") {
  ProgressRecords recs = {world_rank(0, 2), std::nullopt};
  recv_from(*recs[0], 1);
  const auto w = ddprun::analyse_waits(recs, kT0 + 1'000);
  CHECK(w.headline == "rank 0 waits in recv #1 from rank 1, and rank 1 has published no progress record");
  CHECK(w.culprits == std::vector<int>{1});
}
