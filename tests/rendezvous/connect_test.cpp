// Opening a connection (rdzv::connect_waiting): what listens at the endpoint but is not a
// ddprun store is named as such, after a greeting wait of its own, not the connect slice;
// name resolution is bounded by the try's deadline.
#include <catch2/catch.hpp>

#include <netinet/in.h>

#include <atomic>
#include <thread>

#include <unistd.h>

#include "rdzv/tcp_store.hpp"
#include "ports.hpp"
#include "rdzv/resolve.hpp"
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

namespace {

// A resolver that answers 127.0.0.1 after `delay`, counting its calls.
rdzv::LookupFn slow_resolver(std::chrono::milliseconds delay, std::atomic<int>& calls) {
  return [delay, &calls](const std::string&, addrinfo** found) {
    ++calls;
    std::this_thread::sleep_for(delay);
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    return getaddrinfo("127.0.0.1", nullptr, &hints, found);
  };
}

}  // namespace

TEST_CASE("a slow resolver is waited for only until the deadline, and the next try waits on the same lookup",
          "[connect]") {
  std::atomic<int> calls{0};
  auto lookup = slow_resolver(1500ms, calls);
  const auto start = Clock::now();
  auto first = rdzv::resolve("slow-resolver.test", Clock::now() + 200ms, lookup);
  CHECK(Clock::now() - start < 600ms);
  CHECK_FALSE(first.addresses);
  CHECK(first.why == "no answer yet from the resolver for 'slow-resolver.test'");
  auto second = rdzv::resolve("slow-resolver.test", Clock::now() + 200ms, lookup);
  CHECK_FALSE(second.addresses);
  auto third = rdzv::resolve("slow-resolver.test", Clock::now() + 5s, lookup);
  REQUIRE(third.addresses);
  CHECK(third.why.empty());
  CHECK(Clock::now() - start < 2500ms);  // the first lookup's answer, not a fresh 1.5 s one
  CHECK(calls == 1);
  CHECK(reinterpret_cast<const sockaddr_in*>(third.addresses->ai_addr)->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
}

TEST_CASE("a resolver's error is the reason a try failed", "[connect]") {
  auto fails = [](const std::string&, addrinfo**) { return EAI_NONAME; };
  auto r = rdzv::resolve("no-such-name.test", Clock::now() + 1s, fails);
  CHECK_FALSE(r.addresses);
  CHECK(r.why == std::string("cannot resolve 'no-such-name.test': ") + gai_strerror(EAI_NONAME));
}

TEST_CASE("an address is answered at once, without the resolver, even with no time left", "[connect]") {
  std::atomic<int> calls{0};
  auto r = rdzv::resolve("127.0.0.1", Clock::now() - 1s, slow_resolver(1500ms, calls));
  REQUIRE(r.addresses);
  CHECK(calls == 0);
}
