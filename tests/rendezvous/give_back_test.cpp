// When the server hands free heap memory back to the system (malloc_trim, counted in
// ServerStats::trims): after real frees only (a namespace dropped, connections closed,
// stored bytes fallen a megabyte below their peak), not for normal traffic, and at
// most once a second.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "server_fixture.hpp"
#include "raw_client.hpp"

using namespace std::chrono_literals;

TEST_CASE("a steady stream of SETs rewriting keys a little shorter and longer never trims", "[server][memory]") {
  testing::ServerThread server;
  auto client = server.client("job");
  // Progress records rewritten in place: 200 keys of 7 to 8 KB, 40 rounds, 8,000 SETs
  // that shrink a value by 1 KB half of the time (4 MB of shrinking in all) and carry
  // 60 MB of request bodies through the server.
  constexpr int kKeys = 200;
  constexpr int kRounds = 40;
  for (int round = 0; round < kRounds; ++round) {
    const std::string value(round % 2 == 0 ? 8000 : 7000, static_cast<char>('a' + round % 26));
    for (int k = 0; k < kKeys; ++k) client->set("progress/" + std::to_string(k), value);
  }
  CHECK(client->get("progress/0", 2s).size() == 7000);
  std::this_thread::sleep_for(100ms);  // past the 20 ms a trim would wait for
  CHECK(server.stats().trims == 0);
}

TEST_CASE("dropped namespaces are trimmed after, at most once a second", "[server][memory]") {
  testing::ServerThread server;
  auto fill = [&](const std::string& ns) {
    auto c = server.client(ns);
    for (int k = 0; k < 64; ++k) c->set("k" + std::to_string(k), std::string(64u << 10, 'v'));  // 4 MiB
    return c;
  };
  auto first = fill("a");
  auto second = fill("b");
  REQUIRE(server.stats().trims == 0);
  first.reset();  // its last connection: namespace "a" and its 4 MiB go
  REQUIRE(testing::eventually([&] { return server.stats().trims == 1; }, 5s));
  second.reset();  // another 4 MiB at once: its trim waits for the second to pass
  std::this_thread::sleep_for(300ms);
  CHECK(server.stats().trims == 1);
  CHECK(testing::eventually([&] { return server.stats().trims == 2; }, 5s));
  CHECK(server.stats().namespaces == 0);
}
