// PeerWatch (src/peer_watch.hpp): how the NCCL backend learns that a peer process on
// this host has died. Real processes and real pidfds; the peer records go through an
// in-memory store as the group's store would carry them.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "ddp/types.hpp"
#include "forked.hpp"
#include "peer_watch.hpp"
#include "ddp/contract/store_keys.hpp"
#include "rdzv/memory_store.hpp"
#include "exit_fixture.hpp"

using namespace std::chrono_literals;
using ddp::detail::PeerWatch;

namespace {

// Forms a watch as rank 0 of `size` (only to see whether that throws).
void form(rdzv::Store& store, int size, std::chrono::milliseconds timeout) { PeerWatch w(store, 0, size, timeout); }

// Polls until the watch reports a dead peer or `limit` passes; returns its rank or -1.
int wait_for_dead(const PeerWatch& w, std::chrono::milliseconds limit, int only = -1) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (int r = w.dead_peer(only); r >= 0) return r;
    std::this_thread::sleep_for(1ms);
  }
  return -1;
}

}  // namespace

TEST_CASE("peer watch: a peer on this host that dies is named within 2 s", "[peer_watch]") {
  auto peer = testing::idle_child();
  rdzv::MemoryStore store;
  store.set("watch/1", PeerWatch::record_of(peer.pid()));
  PeerWatch w(store, 0, 2, 1000ms);
  CHECK(w.watched() == 1);
  CHECK(w.dead_peer() == -1);
  CHECK_THAT(w.describe(1), Catch::Contains("rank 1 (pid " + std::to_string(peer.pid()) + " on "));
  const auto killed = std::chrono::steady_clock::now();
  REQUIRE(kill(peer.pid(), SIGKILL) == 0);
  CHECK(wait_for_dead(w, 2000ms) == 1);
  // A dead peer must be named within 2 s; a pidfd fires within milliseconds.
  CHECK(std::chrono::steady_clock::now() - killed < 2s);
  CHECK(store.get("watch/0", 0ms) == PeerWatch::record_of(getpid()));
}

TEST_CASE("peer watch: a peer seen dead counts only after the 300 ms grace from that first look", "[peer_watch]") {
  auto peer = testing::idle_child();
  rdzv::MemoryStore store;
  store.set("watch/1", PeerWatch::record_of(peer.pid()));
  PeerWatch w(store, 0, 2, 1000ms);
  REQUIRE(kill(peer.pid(), SIGKILL) == 0);
  REQUIRE(peer.wait(10s).status == 128 + SIGKILL);  // reaped: its pidfd is readable from now on
  const auto first_look = std::chrono::steady_clock::now();
  CHECK(w.dead_peer() == -1);  // seen, but it may have just finished its part of a call
  CHECK(wait_for_dead(w, 2000ms) == 1);
  const auto after = std::chrono::steady_clock::now() - first_look;
  // 300 ms, less a little for the clock reads around the first look.
  CHECK(after >= 250ms);
  CHECK(after < 2s);
}

TEST_CASE("peer watch: a peer that exited before the watch began counts as dead", "[peer_watch]") {
  testing::ForkedChild gone([] { return std::string(); });
  REQUIRE(gone.wait(10s).ok);  // reaped: the pid no longer exists
  const pid_t pid = gone.pid();
  rdzv::MemoryStore store;
  store.set("watch/1", PeerWatch::record_of(pid));
  PeerWatch w(store, 0, 2, 1000ms);
  CHECK(w.dead_peer() == 1);
}

TEST_CASE("peer watch: peers on other hosts are not watched, and malformed or missing records are errors",
          "[peer_watch]") {
  auto peer = testing::idle_child();
  {
    rdzv::MemoryStore store;
    store.set("watch/1", "another-boot-id/1/2/3\n" + std::to_string(peer.pid()) + "\nnode-b");
    PeerWatch w(store, 0, 2, 1000ms);
    CHECK(w.watched() == 0);
    CHECK(w.dead_peer() == -1);
  }
  {
    rdzv::MemoryStore store;
    store.set("watch/1", "only one line");
    CHECK_THROWS_AS(form(store, 2, 1000ms), ddp::Error);
  }
  {
    rdzv::MemoryStore store;
    store.set("watch/2", PeerWatch::record_of(peer.pid()));
    CHECK_THROWS_WITH(form(store, 3, 50ms), Catch::Contains("ranks 1 did not join"));
  }
}

TEST_CASE("peer watch: a subgroup's watch uses the subgroup's ranks", "[peer_watch]") {
  auto a = testing::idle_child();
  auto b = testing::idle_child();
  rdzv::MemoryStore store;
  store.set("watch/1", PeerWatch::record_of(a.pid()));
  store.set("watch/2", PeerWatch::record_of(b.pid()));
  PeerWatch w(store, 0, 3, 1000ms);
  REQUIRE(w.watched() == 2);
  auto sub = w.narrow({2, 0});  // subgroup rank 0 is group rank 2
  CHECK(sub->watched() == 1);
  REQUIRE(kill(a.pid(), SIGKILL) == 0);  // group rank 1: not in the subgroup
  CHECK(wait_for_dead(w, 2000ms) == 1);
  CHECK(sub->dead_peer() == -1);
  REQUIRE(kill(b.pid(), SIGKILL) == 0);
  CHECK(wait_for_dead(*sub, 2000ms) == 0);
  // Named by its global rank (2), with its rank in the subgroup.
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  CHECK(sub->how_gone(0) == "peer rank 2 (group rank 0, pid " + std::to_string(b.pid()) + " on " + host + ") exited");
  CHECK_THAT(w.describe(2), Catch::StartsWith("rank 2 (pid " + std::to_string(b.pid()) + " on "));
  // A nested subgroup keeps the global rank: {1, 0} of {2, 0} is global {0, 2}.
  CHECK_THAT(sub->narrow({1, 0})->describe(1), Catch::StartsWith("rank 2 (group rank 1, pid "));
}

TEST_CASE("peer watch: a point-to-point call waits on its peer's published exit alone, each with its own grace",
          "[peer_watch]") {
  testing::ServerThread server;
  ddp::detail::GroupPeers peers;
  peers.exits = testing::watch_exits(server, 0, 4);
  rdzv::MemoryStore store;
  for (int r = 1; r < 4; ++r) store.set("watch/" + std::to_string(r), "another host\n4711\nnode-b");
  PeerWatch w(store, 0, 4, 1000ms, peers);
  REQUIRE(w.watched() == 0);  // known gone only from their published exits

  auto agent = server.client();
  auto publish = [&](int rank) {
    ddp::contract::ExitRecord e;
    e.rank = rank;
    e.host = "node-b";
    e.time_ms = ddp::contract::unix_millis_now();
    testing::publish_exit(*agent, 0, e);
    REQUIRE(peers.exits->wait_record(rank, 5s));
  };
  publish(3);  // rank 3 is done: a collective fails, a send/recv between 0 and 1 does not
  CHECK(wait_for_dead(w, 5s) == 3);
  CHECK(w.dead_peer(1) == -1);
  publish(1);
  CHECK(w.dead_peer(1) == -1);  // its own grace starts now, not at rank 3's exit
  CHECK(wait_for_dead(w, 5s, 1) == 1);
}
