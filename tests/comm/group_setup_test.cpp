// The all-ranks exchange that every group's formation goes through (group_setup.hpp).
#include <catch2/catch.hpp>

#include <mutex>
#include <thread>

#include "group_setup.hpp"
#include "ddp/types.hpp"
#include "rdzv/memory_store.hpp"
#include "rdzv/prefix_store.hpp"
#include "exit_fixture.hpp"

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
