// The all-ranks exchange that every group's formation goes through (group_setup.hpp),
// and what the TCP mesh says while it waits for peers on other hosts (cpu/mesh.hpp).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <thread>

#include "cpu/mesh.hpp"
#include "ddp/contract/store_keys.hpp"
#include "group_setup.hpp"
#include "ddp/types.hpp"
#include "rdzv/memory_store.hpp"
#include "rdzv/prefix_store.hpp"
#include "exit_fixture.hpp"
#include "ports.hpp"

using namespace std::chrono_literals;

namespace {
// A memory store that remembers how many keys each multi_get asked for.
class CountingStore : public rdzv::MemoryStore {
 public:
  std::vector<std::string> multi_get(const std::vector<std::string>& keys, rdzv::Millis timeout) override {
    {
      std::lock_guard lock(mu);
      asked.push_back(keys.size());
    }
    return MemoryStore::multi_get(keys, timeout);
  }
  std::vector<size_t> calls() {
    std::lock_guard lock(mu);
    return asked;
  }
  std::mutex mu;
  std::vector<size_t> asked;
};
}  // namespace

TEST_CASE("exchange_all returns every rank's value in rank order", "[group_setup]") {
  rdzv::MemoryStore store;
  store.set("x/0", "zero");
  store.set("x/2", "two");
  auto values = ddp::detail::exchange_all(store, "x/", 1, 3, "one", 1000ms);
  CHECK(values == std::vector<std::string>{"zero", "one", "two"});
}

TEST_CASE("exchange_all names exactly the ranks that did not publish, under a prefixed view too",
          "[group_setup]") {
  rdzv::MemoryStore parent;
  rdzv::PrefixStore store("group/7/", parent);
  store.set("info/2", "two");
  // Ranks 1 and 3 never publish; rank 0 is this one.
  CHECK_THROWS_WITH(ddp::detail::exchange_all(store, "info/", 0, 4, "zero", 50ms),
                    Catch::Equals("process group: ranks 1, 3 did not join within 50 ms"));
  CHECK_THROWS_AS(ddp::detail::exchange_all(store, "info/", 0, 4, "zero", 10ms), ddp::Timeout);
}

TEST_CASE("without an exit watch a forming rank waits in one long read, not in slices", "[group_setup]") {
  CountingStore store;
  std::thread late([&] {
    std::this_thread::sleep_for(1500ms);
    store.set("x/1", "one");
  });
  const auto values = ddp::detail::exchange_all(store, "x/", 0, 2, "zero", 10s);
  late.join();
  CHECK(values == std::vector<std::string>{"zero", "one"});
  CHECK(store.calls().size() == 1);  // with 200 ms slices: about 8
}

TEST_CASE("with an exit watch a forming rank reads again only the keys still missing", "[group_setup]") {
  testing::ServerThread server;
  ddp::detail::GroupPeers peers;
  peers.exits = testing::watch_exits(server, 0, 4);
  CountingStore store;
  store.set("x/1", "one");
  store.set("x/2", "two");
  std::thread late([&] {
    std::this_thread::sleep_for(1000ms);
    store.set("x/3", "three");
  });
  const auto values = ddp::detail::exchange_all(store, "x/", 0, 4, "zero", 10s, peers);
  late.join();
  CHECK(values == std::vector<std::string>{"zero", "one", "two", "three"});
  const auto calls = store.calls();
  REQUIRE(calls.size() >= 3);  // all four; the three present once more; then rank 3's alone
  CHECK(calls[0] == 4);
  CHECK(calls[1] == 3);
  for (size_t i = 2; i < calls.size(); ++i) CHECK(calls[i] == 1);
}

namespace {

// What `fn` writes on stderr (the notices of a wait).
template <typename Fn>
std::string stderr_of(Fn&& fn) {
  std::fflush(stderr);
  FILE* capture = std::tmpfile();
  const int saved = dup(STDERR_FILENO);
  dup2(fileno(capture), STDERR_FILENO);
  try {
    fn();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::rewind(capture);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), capture)) > 0;) text.append(buf, n);
  std::fclose(capture);
  return text;
}

// The record a rank on another host publishes for the CPU transport, at `endpoint`.
std::string peer_elsewhere(const std::string& endpoint) {
  return "another-host\n4711\n" + endpoint + "\n/ddp-none\nnode-b\n5\n0\n";
}

}  // namespace

TEST_CASE("a rank forming the TCP mesh says whom it waits for, then names them", "[group_setup][tcp]") {
  const std::string info = ddp::contract::group_keys::exchange(ddp::contract::group_keys::kInfo);
  rdzv::MemoryStore store;
  ddp::cpu::MeshOptions o;
  o.connect_timeout = 1200ms;
  o.peers.notice_every = 400ms;
  // Forms rank `rank` of 2 and returns its error and what it said on stderr.
  auto form = [&](int rank) {
    o.peers.me = rank;
    std::string error;
    const std::string said = stderr_of([&] {
      try {
        ddp::cpu::Mesh mesh(store, rank, 2, o);
      } catch (const ddp::Error& e) {
        error = e.what();
      }
    });
    return std::make_pair(error, said);
  };

  SECTION("a higher rank on another host never connects") {
    store.set(info + "1", peer_elsewhere("127.0.0.1:9"));
    const auto [error, said] = form(0);
    CHECK(error == "process group: ranks 1 did not connect in time");
    CHECK_THAT(said, Catch::Contains("ddp: rank 0 still waiting for rank 1 to connect over TCP (0 s of 1 s)"));
  }
  SECTION("a lower rank on another host never listens") {
    store.set(info + "0", peer_elsewhere("127.0.0.1:" + std::to_string(testing::free_port())));
    const auto [error, said] = form(1);
    CHECK_THAT(error, Catch::StartsWith("process group: cannot connect to rank 0 (pid 4711 on node-b) at 127.0.0.1:") &&
                          Catch::EndsWith(": Connection refused"));
    CHECK_THAT(said, Catch::Contains("ddp: rank 1 still waiting to connect to rank 0 (pid 4711 on node-b) at 127.0.0.1:") &&
                         Catch::Contains(": Connection refused (0 s of 1 s)"));
  }
}
