// The all-ranks exchange that every group's formation goes through (backend.hpp).
#include <catch2/catch.hpp>

#include "backend.hpp"
#include "ddp/types.hpp"
#include "rdzv/memory_store.hpp"
#include "rdzv/prefix_store.hpp"

using namespace std::chrono_literals;

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
