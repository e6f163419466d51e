// The exit watch (exit_watch.hpp) against a real store server: it reads the exit
// slots as ddprun's agents fill them, and group formation fails at once for a rank
// whose exit it has seen, naming that exit, in subgroups by their global ranks.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "group_setup.hpp"
#include "ddp/contract/store_keys.hpp"
#include "exit_fixture.hpp"
#include "forked.hpp"
#include "rdzv/memory_store.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using testing::publish_exit;
using testing::watch_exits;

ddp::contract::ExitRecord exit_of(int rank, int code) {
  ddp::contract::ExitRecord r;
  r.rank = rank;
  r.node_rank = 1;
  r.host = "hostb";
  r.pid = 4711;
  r.exit_code = code;
  r.time_ms = ddp::contract::unix_millis_now();
  return r;
}

}  // namespace

TEST_CASE("the exit watch sees every exit of its attempt, the first of a rank counting", "[exit_watch]") {
  testing::ServerThread server;
  auto agent = server.client();
  auto w = watch_exits(server, 2, 4);
  CHECK(w->generation() == 0);
  CHECK_FALSE(w->exited(1));
  publish_exit(*agent, 1, exit_of(1, 0));   // another attempt: not watched
  publish_exit(*agent, 2, exit_of(3, 7));
  publish_exit(*agent, 2, exit_of(3, 9));   // a second record for the same rank is ignored
  publish_exit(*agent, 2, exit_of(9, 0));   // no such rank: ignored
  agent->set(ddp::contract::JobKeys(2).exit_slot(agent->add(ddp::contract::JobKeys(2).exit_count(), 1) - 1), "junk");
  publish_exit(*agent, 2, exit_of(0, 0));
  const auto record = w->wait_record(0, 5s);
  REQUIRE(record);
  CHECK(w->exited(3));
  CHECK(w->record(3)->exit_code == 7);
  CHECK_FALSE(w->exited(1));
  CHECK(w->generation() == 2);
}

TEST_CASE("the exit watch stops at once when destroyed", "[exit_watch]") {
  testing::ServerThread server;
  auto w = watch_exits(server, 0, 2);
  std::this_thread::sleep_for(50ms);  // blocked in the store by now
  const auto start = Clock::now();
  w.reset();
  CHECK(Clock::now() - start < 500ms);
}

TEST_CASE("forming a group fails within a second naming a rank whose exit is published", "[exit_watch]") {
  testing::ServerThread server;
  auto agent = server.client();
  ddp::detail::GroupPeers peers;
  peers.exits = watch_exits(server, 0, 4);
  rdzv::MemoryStore group_store;
  publish_exit(*agent, 0, exit_of(2, 0));
  REQUIRE(peers.exits->wait_record(2, 5s));
  const auto start = Clock::now();
  CHECK_THROWS_MATCHES(ddp::detail::exchange_all(group_store, "info/", 0, 4, "zero", 30s, peers), ddp::PeerError,
                       Catch::Matchers::Predicate<ddp::PeerError>([](const ddp::PeerError& e) {
                         const std::string what = e.what();
                         return e.rank() == 2 && what.find("rank 2 exited with code 0 at ") != std::string::npos &&
                                what.find(" on node 1 (hostb), before joining the process group") != std::string::npos;
                       }));
  CHECK(Clock::now() - start < 1s);

  // A subgroup of global ranks {1, 2}: its rank 1 is global rank 2.
  const auto sub = peers.narrow({1, 2});
  CHECK(sub.global(1) == 2);
  CHECK_THROWS_AS(ddp::detail::exchange_all(group_store, "sub/", 0, 2, "one", 30s, sub), ddp::PeerError);
  // A subgroup without it forms (and times out) as before.
  CHECK_THROWS_AS(ddp::detail::exchange_all(group_store, "other/", 0, 2, "x", 300ms, peers.narrow({0, 1})),
                  ddp::Timeout);
}

TEST_CASE("a reserved exit slot never written does not hide the exits after it", "[exit_watch]") {
  testing::ServerThread server;
  auto agent = server.client();
  auto w = watch_exits(server, 0, 4);
  const ddp::contract::JobKeys keys(0);
  const int64_t lost = agent->add(keys.exit_count(), 1) - 1;  // an agent that died before its set
  const auto start = Clock::now();
  publish_exit(*agent, 0, exit_of(2, 0));
  REQUIRE(w->wait_record(2, 10s));
  CHECK(Clock::now() - start < 5s);  // about 2 s (the skip) on an idle machine
  // Written late after all, it still counts.
  agent->set(keys.exit_slot(lost), exit_of(1, 3).encode());
  const auto late = w->wait_record(1, 10s);
  REQUIRE(late);
  CHECK(late->exit_code == 3);
}

TEST_CASE("a forked child destroys its copy of the exit watch without hanging", "[exit_watch]") {
  testing::ServerThread server;
  auto w = watch_exits(server, 0, 2);
  std::this_thread::sleep_for(50ms);  // the parent's thread is blocked in the store
  testing::ForkedChild child([&] {
    w.reset();  // joined a thread only the parent has before the fix: hung
    return std::string("gone");
  });
  const auto result = child.wait(10s);  // throws when the child hangs
  CHECK(result.ok);
  CHECK(result.payload == "gone");
  // The parent's watch still works.
  auto agent = server.client();
  publish_exit(*agent, 0, exit_of(1, 0));
  CHECK(w->wait_record(1, 5s));
}
