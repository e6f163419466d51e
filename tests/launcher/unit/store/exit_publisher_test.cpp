// ddprun's exit publisher (exit_publisher.hpp) against a real store server: records
// land in consecutive exit slots of their attempt; a store that is gone never holds
// up the caller nor ddprun's exit.
#include <catch2/catch.hpp>

#include <chrono>

#include "ddp/contract/store_keys.hpp"
#include "store/exit_publisher.hpp"
#include "server_fixture.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

ddp::contract::ExitRecord record(int rank, int code, int signal = 0) {
  ddp::contract::ExitRecord r;
  r.rank = rank;
  r.node_rank = 0;
  r.host = "hosta";
  r.pid = 100 + rank;
  r.exit_code = code;
  r.signal = signal;
  r.time_ms = 1234;
  return r;
}

}  // namespace

TEST_CASE("the exit publisher fills the exit slots of each attempt in order", "[exit_publisher]") {
  testing::ServerThread server;
  auto store = server.client("job");  // (a namespace's keys go with its last connection)
  {
    ddprun::ExitPublisher publisher(std::shared_ptr<rdzv::TcpStore>(server.client("job")));
    publisher.publish(0, record(1, 0));
    publisher.publish(0, record(0, 0, 9));
    publisher.publish(1, record(1, 3));
    CHECK(publisher.flush(5s));
  }
  const ddp::contract::JobKeys first(0), second(1);
  CHECK(store->get(first.exit_count(), 1s) == "2");
  CHECK(ddp::contract::ExitRecord::decode(store->get(first.exit_slot(0), 1s))->rank == 1);
  const auto killed = ddp::contract::ExitRecord::decode(store->get(first.exit_slot(1), 1s));
  REQUIRE(killed);
  CHECK(killed->signal == 9);
  const auto later = ddp::contract::ExitRecord::decode(store->get(second.exit_slot(0), 1s));
  REQUIRE(later);
  CHECK(later->exit_code == 3);
}

TEST_CASE("a store that is gone neither blocks publish() nor holds up the exit", "[exit_publisher]") {
  auto server = std::make_unique<testing::ServerThread>();
  std::shared_ptr<rdzv::TcpStore> store = server->client("job");
  server.reset();  // the store is gone: no record can be written any more (no reconnect)
  const auto start = Clock::now();
  {
    ddprun::ExitPublisher publisher(store);
    publisher.publish(0, record(1, 0));
    publisher.publish(0, record(2, 0));
    CHECK(Clock::now() - start < 100ms);
    CHECK(publisher.flush(5s));  // both dropped (with one warning), at once
    CHECK(Clock::now() - start < 1s);
    publisher.publish(1, record(3, 0));
  }
  CHECK(Clock::now() - start < 3s);
}
