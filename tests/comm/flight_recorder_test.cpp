// The flight recorder (src/flight_recorder.hpp): the ring, the states a call goes
// through, DDP_FLIGHT_RECORDER=0, how sends and recvs are numbered apart from the
// collectives, subgroup names, groups made of groups, and the CPU backend marking
// its calls for real (a one-rank group over an in-memory store). Across processes
// under ddprun: tests/comm/progress_test.cpp.
#include <catch2/catch.hpp>
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "group_setup.hpp"
#include "recording_backend.hpp"
#include "ddp/progress.hpp"
#include "flight_recorder.hpp"
#include "rdzv/memory_store.hpp"

using namespace std::chrono_literals;
using ddp::detail::CallState;
using ddp::detail::FlightRecorder;
using ddp::detail::RecorderClock;

namespace {

float data[64];
ddp::Buffer floats(size_t n) { return ddp::Buffer{data, n, ddp::DType::F32, ddp::Device::Cpu}; }

ddp::detail::Op call(ddp::detail::OpKind kind, uint64_t seq, size_t n = 4, int peer = -1) {
  ddp::detail::Op op;
  op.kind = kind;
  op.input = op.output = floats(n);
  op.peer = peer;
  op.seq = seq;
  return op;
}

// A group whose calls all succeed at once without a Work (as a test stand-in or a
// backend that keeps no handle would): issue() itself must settle them. `calls`
// (when given) receives what reached its backend.
std::shared_ptr<ddp::ProcessGroup> instant_group(int rank = 0, int size = 2,
                                                 std::shared_ptr<std::vector<std::string>>* calls = nullptr) {
  return testing::recording_group("instant", rank, size, ddp::detail::Reach::HostAndGpu, calls);
}

// The recorder of the live group named `name` (exactly one expected).
std::shared_ptr<FlightRecorder> recorder_named(const std::string& name) {
  std::shared_ptr<FlightRecorder> found;
  int count = 0;
  for (auto& r : ddp::detail::all_recorders()) {
    if (r->name() == name) {
      found = r;
      ++count;
    }
  }
  INFO("recorders named " << name);
  REQUIRE(count == 1);
  return found;
}

// Sets an environment variable for one scope.
// A one-rank CPU group over an in-memory store.
std::shared_ptr<ddp::ProcessGroup> one_rank_cpu_group() {
  ddp::detail::GroupSetup setup;
  setup.store = std::make_shared<rdzv::MemoryStore>();
  setup.timeout = 5000ms;
  setup.connect_timeout = 5000ms;
  return std::make_shared<ddp::ProcessGroup>(ddp::detail::make_cpu_backend(setup));
}

struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  const char* name_;
};

}  // namespace

TEST_CASE("flight recorder: a ring keeps the last N calls, oldest first", "[recorder]") {
  auto r = FlightRecorder::create(3, 0, 2);
  const auto t = RecorderClock::now();
  for (uint64_t seq = 1; seq <= 5; ++seq) r->queued(call(ddp::detail::OpKind::AllReduce, seq, seq), t);
  const auto calls = r->calls();
  REQUIRE(calls.size() == 3);
  CHECK(calls[0].id == 3);
  CHECK(calls[0].seq == 3);
  CHECK(calls[0].count == 3);
  CHECK(calls[2].seq == 5);
  CHECK(calls[2].describe() == "all_reduce 5\u00d7f32 sum");
  // Marks for calls the ring no longer holds are ignored.
  r->ended(1, false, t);
  CHECK(r->calls()[0].state == CallState::Queued);
}

TEST_CASE("flight recorder: a call goes queued, started, then completed or failed", "[recorder]") {
  auto r = FlightRecorder::create(8, 1, 4);
  r->set_name("0.3");
  const auto t0 = RecorderClock::now();
  const uint64_t a = r->queued(call(ddp::detail::OpKind::Broadcast, 1, 10, 2), t0);
  CHECK(r->calls().back().state == CallState::Queued);
  auto g = r->progress();
  CHECK(g.group == "0.3");
  CHECK(g.rank == 1);
  CHECK(g.size == 4);
  CHECK(g.issued == 1);
  CHECK(g.completed == 0);
  REQUIRE(g.current);
  CHECK(g.current->state == "queued");
  CHECK(g.current->what == "broadcast 10\u00d7f32 root 2");
  CHECK_FALSE(g.last_completed);

  r->started(a, t0 + 1ms);
  CHECK(r->calls().back().state == CallState::Started);
  r->ended(a, true, t0 + 3ms);
  r->ended(a, false, t0 + 5ms);  // a second report keeps the first outcome
  auto c = r->calls().back();
  CHECK(c.state == CallState::Completed);
  CHECK(c.started - c.queued == 1ms);
  CHECK(c.ended - c.queued == 3ms);
  g = r->progress();
  CHECK(g.completed == 1);
  REQUIRE(g.last_completed);
  CHECK(g.last_completed->seq == 1);
  CHECK(g.last_completed->state == "completed");
  // since_ms is unix time: within a few seconds of now.
  CHECK(std::llabs(g.last_completed->since_ms - ddp::contract::unix_millis_now()) < 5000);

  int heard = 0;
  const int handle = ddp::detail::add_failure_listener([&] { ++heard; });
  const uint64_t b = r->queued(call(ddp::detail::OpKind::Barrier, 2, 0), t0);
  r->started(b, t0);
  r->ended(b, false, t0);
  ddp::detail::remove_failure_listener(handle);
  CHECK(heard == 1);
  g = r->progress();
  CHECK(g.issued == 2);
  CHECK(g.completed == 1);
  CHECK(g.current->state == "failed");
  CHECK(g.current->what == "barrier");
  CHECK(g.last_completed->seq == 1);
}

TEST_CASE("flight recorder: sends and recvs are in the ring but numbered per peer, apart from collectives",
          "[recorder]") {
  auto pg = instant_group(0, 3);
  pg->send(floats(4), 1);
  pg->all_reduce(floats(4), ddp::ReduceOp::Max);
  pg->send(floats(4), 1);
  pg->send(floats(2), 2);
  pg->recv(floats(4), 1);
  auto r = recorder_named("0");
  const auto calls = r->calls();
  REQUIRE(calls.size() == 5);
  std::vector<std::string> seen;
  for (const auto& c : calls) {
    seen.push_back(c.describe() + " #" + std::to_string(c.seq));
    CHECK(c.state == CallState::Completed);  // settled by issue(): the group returned no Work
  }
  CHECK(seen == std::vector<std::string>{"send 4\u00d7f32 to 1 #1", "all_reduce 4\u00d7f32 max #1",
                                         "send 4\u00d7f32 to 1 #2", "send 2\u00d7f32 to 2 #1",
                                         "recv 4\u00d7f32 from 1 #1"});
  const auto g = r->progress();
  CHECK(g.issued == 1);
  CHECK(g.completed == 1);
  REQUIRE(g.current);
  CHECK(g.current->what == "all_reduce 4\u00d7f32 max");
}

TEST_CASE("flight recorder: pending sends and recvs are in the progress record with peer and number",
          "[recorder]") {
  auto r = FlightRecorder::create(8, 0, 3);
  const auto t0 = RecorderClock::now();
  using ddp::detail::OpKind;
  const uint64_t ar = r->queued(call(OpKind::AllReduce, 1), t0);
  r->ended(ar, true, t0);
  const uint64_t s1 = r->queued(call(OpKind::Send, 1, 4, 2), t0);
  const uint64_t r1 = r->queued(call(OpKind::Recv, 1, 4, 1), t0);
  r->started(r1, t0 + 1ms);
  auto g = r->progress();
  CHECK(g.issued == 1);
  CHECK(g.completed == 1);
  CHECK(g.p2p_completed == 0);
  CHECK(g.p2p_done_ms == 0);
  REQUIRE(g.p2p_pending.size() == 2);  // oldest first
  CHECK(g.p2p_pending[0].send());
  CHECK(g.p2p_pending[0].peer == 2);
  CHECK(g.p2p_pending[0].op.state == "queued");
  CHECK(g.p2p_pending[1].op.what == "recv 4\u00d7f32 from 1");
  CHECK(g.p2p_pending[1].op.seq == 1);
  CHECK(g.p2p_pending[1].peer == 1);
  CHECK(g.p2p_pending[1].op.state == "started");

  r->ended(s1, true, t0 + 2ms);
  g = r->progress();
  CHECK(g.p2p_completed == 1);
  CHECK(std::llabs(g.p2p_done_ms - ddp::contract::unix_millis_now()) < 5000);
  REQUIRE(g.p2p_pending.size() == 1);
  CHECK(g.p2p_pending[0].peer == 1);
  // A failed recv is no longer pending, and counts as no completion.
  r->ended(r1, false, t0 + 3ms);
  g = r->progress();
  CHECK(g.p2p_pending.empty());
  CHECK(g.p2p_completed == 1);
  // Many pending: the newest few are shown.
  for (uint64_t k = 1; k <= 12; ++k) r->queued(call(OpKind::Recv, k + 1, 4, 1), t0);
  g = r->progress();
  REQUIRE(g.p2p_pending.size() == FlightRecorder::kMaxPendingShown);
  CHECK(g.p2p_pending.back().op.seq == 13);
}

TEST_CASE("flight recorder: subgroups are named 0.k and record their own calls", "[recorder]") {
  auto pg = instant_group(1, 4);
  auto outside = pg->new_group({0, 2});  // subgroup 0: this rank is not in it
  CHECK(outside == nullptr);
  auto sub = pg->new_group({3, 1});  // subgroup 1
  REQUIRE(sub);
  auto subsub = sub->new_group({0, 1});
  REQUIRE(subsub);
  sub->barrier();
  sub->barrier();
  subsub->all_reduce(floats(1));
  CHECK(sub->name() == "0.1");
  CHECK(subsub->name() == "0.1.0");
  auto g = recorder_named("0.1")->progress();
  CHECK(g.rank == 1);
  CHECK(g.size == 2);
  CHECK(g.issued == 2);
  CHECK(g.completed == 2);
  CHECK(recorder_named("0.1.0")->progress().issued == 1);
  CHECK(recorder_named("0")->progress().issued == 0);  // new_group is no call
}

TEST_CASE("flight recorder: DDP_FLIGHT_RECORDER=0 records nothing", "[recorder]") {
  const size_t before = ddp::detail::all_recorders().size();
  ScopedEnv off("DDP_FLIGHT_RECORDER", "0");
  CHECK(ddp::detail::configured_recorder_entries() == 0);
  std::shared_ptr<std::vector<std::string>> calls;
  auto pg = instant_group(0, 2, &calls);
  pg->all_reduce(floats(4));
  CHECK(calls->size() == 1);
  CHECK(pg->issued() == 1);  // still numbered
  CHECK(ddp::detail::all_recorders().size() == before);
}

TEST_CASE("flight recorder: DDP_FLIGHT_RECORDER sets the ring's size", "[recorder]") {
  ScopedEnv five("DDP_FLIGHT_RECORDER", "5");
  auto pg = instant_group();
  for (int i = 0; i < 12; ++i) pg->barrier();
  const auto calls = recorder_named("0")->calls();
  REQUIRE(calls.size() == 5);
  CHECK(calls.front().seq == 8);
  CHECK(calls.back().seq == 12);
}

TEST_CASE("flight recorder: a group made of groups records each call once", "[recorder]") {
  auto host = testing::recording("instant", 0, 2, ddp::detail::Reach::HostAndGpu);
  auto gpu = testing::recording("instant", 0, 2, ddp::detail::Reach::HostAndGpu);
  const auto host_calls = host.calls;
  const size_t before = ddp::detail::all_recorders().size();
  auto pg = std::make_shared<ddp::ProcessGroup>(
      ddp::detail::make_routed_backend(std::move(host.backend), std::move(gpu.backend)));
  CHECK(ddp::detail::all_recorders().size() == before + 1);  // the group's; its members record nothing
  pg->all_reduce(floats(4));
  pg->barrier();
  CHECK(host_calls->size() == 2);
  const auto calls = recorder_named("0")->calls();
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].state == CallState::Completed);
}

TEST_CASE("flight recorder: the CPU backend marks its calls, inline and queued, and a failed one",
          "[recorder]") {
  auto pg = one_rank_cpu_group();
  auto r = recorder_named("0");

  pg->all_reduce(floats(16));  // blocking: inline on this thread
  auto c = r->calls().back();
  CHECK(c.state == CallState::Completed);
  CHECK(c.started >= c.queued);
  CHECK(c.ended >= c.started);

  auto w = pg->all_reduce(floats(16), ddp::ReduceOp::Sum, {.async_op = true});  // the progress thread
  w.wait();
  CHECK(r->calls().back().state == CallState::Completed);
  CHECK(r->progress().completed == 2);

  pg->abort("test");
  CHECK_THROWS(pg->barrier());
  const auto g = r->progress();
  CHECK(g.issued == 3);
  CHECK(g.completed == 2);
  REQUIRE(g.current);
  CHECK(g.current->what == "barrier");
  CHECK(g.current->state == "failed");
}

TEST_CASE("flight recorder: marking a call whose slot a newer call took leaves the newer one intact",
          "[recorder]") {
  auto r = FlightRecorder::create(2, 0, 1);
  const auto t = RecorderClock::now();
  for (uint64_t seq = 1; seq <= 3; ++seq) r->queued(call(ddp::detail::OpKind::AllReduce, seq), t);
  r->started(1, t + 1ms);  // call 3 holds call 1's slot now
  r->ended(1, true, t + 2ms);
  const auto calls = r->calls();
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].id == 3);
  CHECK(calls[1].state == CallState::Queued);
  CHECK(calls[1].started == RecorderClock::time_point{});
  CHECK(calls[1].ended == RecorderClock::time_point{});

  // The same race for real: one thread queues calls, another marks them a little
  // behind, more calls in flight than the ring holds. A call shown started or ended
  // before the marking thread reached it was overwritten by a stale mark. (The window
  // is a few instructions wide: this rarely catches the old check-then-write, so the
  // deterministic case above is the one that pins the rule.)
  auto ring = FlightRecorder::create(2, 0, 1);
  constexpr uint64_t kCalls = 200000;
  std::atomic<uint64_t> queued_upto{0}, marking{0};
  std::thread marker([&] {
    for (uint64_t id = 1; id <= kCalls; ++id) {
      while (queued_upto.load(std::memory_order_acquire) < id) std::this_thread::yield();
      marking.store(id, std::memory_order_release);
      ring->started(id, RecorderClock::now());
      ring->ended(id, true);
    }
  });
  uint64_t stale = 0;
  for (uint64_t seq = 1; seq <= kCalls; ++seq) {
    queued_upto.store(ring->queued(call(ddp::detail::OpKind::AllReduce, seq), RecorderClock::now()),
                      std::memory_order_release);
    if (seq % 16 != 0) continue;
    const auto snapshot = ring->calls();
    const uint64_t reached = marking.load(std::memory_order_acquire);
    for (const auto& c : snapshot) {
      if (c.id > reached && c.state != CallState::Queued) ++stale;
    }
  }
  marker.join();
  CHECK(stale == 0);
  CHECK(ring->calls().back().state == CallState::Completed);
}

TEST_CASE("flight recorder: a send or recv pending longer than the ring holds it is no longer open",
          "[recorder]") {
  using ddp::detail::OpKind;
  auto r = FlightRecorder::create(2, 0, 2);
  const auto t = RecorderClock::now();
  const uint64_t send = r->queued(call(OpKind::Send, 1, 4, 1), t);
  r->queued(call(OpKind::Recv, 1, 4, 1), t);
  r->started(send, t + 1ms);
  CHECK(r->p2p_open() == 2);
  // Two collectives take both slots while the send and the recv are pending.
  r->queued(call(OpKind::AllReduce, 1), t + 2ms);
  r->queued(call(OpKind::AllReduce, 2), t + 3ms);
  CHECK(r->p2p_open() == 0);
  r->ended(send, true, t + 4ms);  // its slot is taken: counted once, when it was taken
  r->ended(send, true, t + 4ms);
  CHECK(r->p2p_open() == 0);
  const auto g = r->progress();
  CHECK(g.p2p_pending.empty());
  CHECK(g.p2p_completed == 0);  // neither end was seen
  // Later sends and recvs are counted as before.
  const uint64_t next = r->queued(call(OpKind::Send, 2, 4, 1), t + 5ms);
  CHECK(r->p2p_open() == 1);
  REQUIRE(r->progress().p2p_pending.size() == 1);
  r->ended(next, true, t + 6ms);
  CHECK(r->p2p_open() == 0);
  CHECK(r->progress().p2p_completed == 1);
}

TEST_CASE("flight recorder: more async calls in flight than DDP_FLIGHT_RECORDER holds", "[recorder]") {
  ScopedEnv two("DDP_FLIGHT_RECORDER", "2");
  auto pg = one_rank_cpu_group();
  auto r = recorder_named("0");
  REQUIRE(r->entries() == 2);
  constexpr int kCalls = 500;
  std::vector<ddp::Work> works;
  for (int i = 0; i < kCalls; ++i) works.push_back(pg->all_reduce(floats(16), ddp::ReduceOp::Sum, {.async_op = true}));
  for (auto& w : works) w.wait();
  const auto calls = r->calls();
  REQUIRE(calls.size() == 2);
  for (const auto& c : calls) {
    INFO("call " << c.id);
    CHECK(c.state == CallState::Completed);
    CHECK(c.started >= c.queued);
    CHECK(c.ended >= c.started);
  }
  CHECK(calls.back().seq == kCalls);
  CHECK(r->progress().completed == kCalls);
}

TEST_CASE("report_step counts steps", "[recorder]") {
  const uint64_t before = ddp::reported_steps();
  ddp::report_step();
  ddp::report_step();
  CHECK(ddp::reported_steps() == before + 2);
}
