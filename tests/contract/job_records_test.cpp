// The exit and progress records round-trip, tolerate what a newer writer adds, and
// refuse what no writer makes.
#include <catch2/catch.hpp>

#include "ddp/contract/job_records.hpp"

using namespace ddp::contract;

TEST_CASE("an exit record round-trips and describes the exit", "[job_records]") {
  ExitRecord r;
  r.rank = 1;
  r.node_rank = 1;
  r.host = "n1";
  r.pid = 4711;
  r.exit_code = 0;
  r.time_ms = 1'700'000'001'234;
  const auto back = ExitRecord::decode(r.encode());
  REQUIRE(back);
  CHECK(back->rank == 1);
  CHECK(back->node_rank == 1);
  CHECK(back->host == "n1");
  CHECK(back->pid == 4711);
  CHECK(back->time_ms == r.time_ms);
  CHECK(back->succeeded());
  CHECK(back->describe().rfind("rank 1 exited with code 0 at ", 0) == 0);
  CHECK(back->describe().find(".234 on node 1 (n1)") != std::string::npos);

  r.signal = 9;
  CHECK(r.how() == "was killed by signal 9 (SIGKILL)");
  CHECK_FALSE(ExitRecord::decode(r.encode())->succeeded());
}

TEST_CASE("a host name with a tab or newline cannot break a record", "[job_records]") {
  ExitRecord r;
  r.host = "a\tb\nc";
  const auto back = ExitRecord::decode(r.encode());
  REQUIRE(back);
  CHECK(back->host == "a b c");
}

TEST_CASE("malformed exit records decode to nothing", "[job_records]") {
  CHECK_FALSE(ExitRecord::decode(""));
  CHECK_FALSE(ExitRecord::decode("exit"));
  CHECK_FALSE(ExitRecord::decode("exit\trank=1"));
  CHECK_FALSE(ExitRecord::decode("progress\trank=1\tnode=0\thost=h\tpid=1\tcode=0\tsignal=0\ttime_ms=1"));
  CHECK_FALSE(ExitRecord::decode("exit\trank=-1\tnode=0\thost=h\tpid=1\tcode=0\tsignal=0\ttime_ms=1"));
  CHECK_FALSE(ExitRecord::decode("exit\trank=1\tnode=0\thost=h\tpid=1\tcode=300\tsignal=0\ttime_ms=1"));
  // Unknown fields are a newer writer's: ignored.
  CHECK(ExitRecord::decode("exit\trank=1\tnode=0\thost=h\tpid=1\tcode=0\tsignal=0\ttime_ms=1\tnew=x"));
}

TEST_CASE("a progress record round-trips with its groups", "[job_records]") {
  ProgressRecord p;
  p.rank = 3;
  p.pid = 99;
  p.host = "hostb";
  p.time_ms = 5;
  p.steps = 120;
  p.rss_kb = 2048;
  GroupProgress world;
  world.group = "0";
  world.rank = 3;
  world.size = 4;
  world.issued = 57;
  world.completed = 56;
  world.current = OpSummary{57, "all_reduce 262144×f32 sum", "started", 1000};
  world.last_completed = OpSummary{56, "broadcast 10×i64 root 0", "completed", 900};
  GroupProgress sub;
  sub.group = "0.1";
  sub.rank = 0;
  sub.size = 2;
  p.groups = {world, sub};

  const auto back = ProgressRecord::decode(p.encode());
  REQUIRE(back);
  CHECK(back->rank == 3);
  CHECK(back->steps == 120);
  CHECK(back->rss_kb == 2048);
  REQUIRE(back->groups.size() == 2);
  CHECK(back->groups[0].issued == 57);
  REQUIRE(back->groups[0].current);
  CHECK(back->groups[0].current->what == "all_reduce 262144×f32 sum");
  CHECK(back->groups[0].current->state == "started");
  REQUIRE(back->groups[0].last_completed);
  CHECK(back->groups[0].last_completed->seq == 56);
  CHECK(back->groups[1].group == "0.1");
  CHECK_FALSE(back->groups[1].current);
}

TEST_CASE("malformed progress records decode to nothing", "[job_records]") {
  CHECK_FALSE(ProgressRecord::decode(""));
  CHECK_FALSE(ProgressRecord::decode("group\tname=0"));
  const std::string head = "progress\trank=0\tpid=1\thost=h\ttime_ms=1\tsteps=0\trss_kb=0";
  CHECK(ProgressRecord::decode(head));
  CHECK(ProgressRecord::decode(head + "\nfuture\tx=1"));  // a line kind a newer writer added
  CHECK_FALSE(ProgressRecord::decode(head + "\ngroup\tname=0\trank=2\tsize=2\tissued=0\tcompleted=0"));
  CHECK_FALSE(ProgressRecord::decode(head + "\ngroup\tname=0\trank=0\tsize=2\tissued=1\tcompleted=2"));
}

TEST_CASE("a progress record carries each group's pending sends and recvs", "[job_records]") {
  ProgressRecord p;
  p.host = "hosta";
  GroupProgress world;
  world.group = "0";
  world.rank = 0;
  world.size = 3;
  world.p2p_completed = 4;
  world.p2p_done_ms = 1234;
  world.p2p_pending = {PeerCall{OpSummary{1, "recv 4×f32 from 1", "started", 2000}, 1},
                       PeerCall{OpSummary{3, "send 8×u8 to 2", "queued", 2100}, 2}};
  GroupProgress sub;
  sub.group = "0.0";
  sub.rank = 1;
  sub.size = 2;
  sub.p2p_pending = {PeerCall{OpSummary{2, "recv 1×i64 from 0", "started", 2200}, 0}};
  p.groups = {world, sub};

  const auto back = ProgressRecord::decode(p.encode());
  REQUIRE(back);
  REQUIRE(back->groups.size() == 2);
  CHECK(back->groups[0].p2p_completed == 4);
  CHECK(back->groups[0].p2p_done_ms == 1234);
  REQUIRE(back->groups[0].p2p_pending.size() == 2);
  CHECK(back->groups[0].p2p_pending[0].peer == 1);
  CHECK(back->groups[0].p2p_pending[0].op.seq == 1);
  CHECK(back->groups[0].p2p_pending[0].op.what == "recv 4×f32 from 1");
  CHECK_FALSE(back->groups[0].p2p_pending[0].send());
  CHECK(back->groups[0].p2p_pending[1].send());
  CHECK(back->groups[0].p2p_pending[1].op.state == "queued");
  REQUIRE(back->groups[1].p2p_pending.size() == 1);
  CHECK(back->groups[1].p2p_pending[0].op.since_ms == 2200);

  // A pending call before any group, or naming a peer outside its group, is refused.
  const std::string head = "progress\trank=0\tpid=1\thost=h\ttime_ms=1\tsteps=0\trss_kb=0";
  const std::string group = "\ngroup\tname=0\trank=0\tsize=2\tissued=0\tcompleted=0";
  const std::string call = "\tseq=1\top=recv 1×u8 from 1\tstate=started\tsince_ms=5";
  CHECK(ProgressRecord::decode(head + group + "\np2p\tpeer=1" + call));
  CHECK_FALSE(ProgressRecord::decode(head + "\np2p\tpeer=1" + call));
  CHECK_FALSE(ProgressRecord::decode(head + group + "\np2p\tpeer=2" + call));
  CHECK_FALSE(ProgressRecord::decode(head + group + "\np2p\tpeer=1"));
}
