// Opening a connection (rdzv::connect_waiting): what listens at the endpoint but is not a
// ddprun store is named as such, after a greeting wait of its own, not the connect slice.
#include <catch2/catch.hpp>

#include <unistd.h>

#include "rdzv/tcp_store.hpp"
#include "ports.hpp"
#include "server_fixture.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// A loopback TCP listener that accepts (the kernel's backlog does) and never says a word,
// as a torchrun TCPStore does until its client speaks.
struct SilentListener {
  SilentListener() { REQUIRE((fd = testing::loopback_listener(port)) >= 0); }
  ~SilentListener() { close(fd); }
  int fd = -1;
  uint16_t port = 0;
};
}  // namespace

TEST_CASE("a listener that never greets is named not a ddprun store, after the greeting wait, within the timeout",
          "[connect]") {
  SilentListener silent;
  rdzv::TcpStoreOptions options;
  options.port = silent.port;
  options.handshake_timeout = 1500ms;
  rdzv::Waiting w;
  w.slice = 100ms;  // the launcher's slice: far shorter than a greeting may take
  const std::string where = "127.0.0.1:" + std::to_string(silent.port);
  auto describe = [](const std::string& reason) { return reason; };

  SECTION("the greeting wait is the client's own, not the slice") {
    w.timeout = 8s;
    const auto start = Clock::now();
    REQUIRE_THROWS_WITH(rdzv::connect_waiting(options, w, describe),
                        "something listens at " + where +
                            " but is not a ddprun store (a torchrun TCPStore?): no greeting within 1500 ms");
    const auto took = Clock::now() - start;
    CHECK(took >= 1400ms);
    CHECK(took < 4s);
  }
  SECTION("and ends with what is left of the wait's timeout") {
    w.timeout = 600ms;
    const auto start = Clock::now();
    REQUIRE_THROWS_WITH(rdzv::connect_waiting(options, w, describe),
                        Catch::Contains("something listens at " + where + " but is not a ddprun store"));
    const auto took = Clock::now() - start;
    CHECK(took >= 500ms);
    CHECK(took < 1200ms);
  }
}

TEST_CASE("a ddprun store is still reached through the same short slices", "[connect]") {
  testing::ServerThread server;
  rdzv::TcpStoreOptions options;
  options.port = server.port();
  rdzv::Waiting w;
  w.slice = 100ms;
  w.timeout = 5s;
  auto c = rdzv::connect_waiting(options, w, [](const std::string& reason) { return reason; });
  REQUIRE(c.store);
  c.store->set("k", "v");
  CHECK(c.store->get("k", 1s) == "v");
}
