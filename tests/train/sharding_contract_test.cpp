// Issue 16's sharding headers compile together (their implementations are still to come):
// the contract the work is split on.
#include <catch2/catch.hpp>

#include "ddp/fully_sharded_data_parallel.hpp"
#include "ddp/zero_redundancy_optimizer.hpp"

TEST_CASE("a flat group's shard is its padded size split over the world", "[train][sharding]") {
  ddp::FlatGroup g;
  g.numel = 10;
  g.padded = 12;
  g.world = 3;
  CHECK(g.shard() == 4);
  ddp::MemoryStats m{.params = 1, .grads = 2, .optimizer = 3, .comm = 4, .transient_peak = 5};
  CHECK(m.held() == 6);
  ddp::FsdpStepStats s;
  CHECK(s.hidden() == 1.0);
  s.comm_busy = 2.0;
  s.comm_wait = 0.5;
  CHECK(s.hidden() == Approx(0.75));
}
