// DDP_SOCKET_IFNAME: which interface the TCP mesh binds and advertises. On this
// machine's real loopback interface, and on made-up lists for what a test machine
// cannot have (several interfaces, one down, one without IPv4).
#include <catch2/catch.hpp>

#include "cpu/interfaces.hpp"
#include "ddp/types.hpp"

using ddp::cpu::InterfaceSpec;
using ddp::cpu::list_interfaces;
using ddp::cpu::NetInterface;
using ddp::cpu::pick_interface;

namespace {

std::vector<NetInterface> a_host() {
  return {
      {"lo", 1, true, true, "127.0.0.1"},
      {"eth0", 2, true, false, "10.0.0.5"},
      {"eth1", 3, true, false, "192.168.7.5"},
      {"ib0", 4, true, false, "10.9.0.5"},
      {"docker0", 5, true, false, "172.17.0.1"},
      {"eth2", 6, false, false, "10.2.0.5"},  // down
      {"eth3", 7, true, false, ""},           // no IPv4 address
  };
}

}  // namespace

TEST_CASE("this host's loopback is listed up with 127.0.0.1", "[interfaces]") {
  const auto all = list_interfaces();
  auto lo = std::find_if(all.begin(), all.end(), [](const NetInterface& i) { return i.name == "lo"; });
  REQUIRE(lo != all.end());
  CHECK(lo->up);
  CHECK(lo->loopback);
  CHECK(lo->ipv4 == "127.0.0.1");
  CHECK(lo->index > 0);
  for (size_t k = 1; k < all.size(); ++k) CHECK(all[k - 1].index <= all[k].index);
}

TEST_CASE("on this host a prefix or an exact name picks lo and a wrong one is named", "[interfaces]") {
  const auto all = list_interfaces();
  CHECK(pick_interface("lo", all).ipv4 == "127.0.0.1");
  CHECK(pick_interface("l", all).name == "lo");        // a prefix
  CHECK(pick_interface("=lo", all).name == "lo");      // exact
  CHECK(pick_interface("nosuch,lo", all).name == "lo");
  CHECK_THROWS_AS(pick_interface("=l", all), ddp::Error);  // exact: "l" is not "lo"
  CHECK_THROWS_WITH(pick_interface("nosuch", all),
                    Catch::Contains("DDP_SOCKET_IFNAME='nosuch' matches no interface") &&
                        Catch::Contains("lo (127.0.0.1)"));
}

TEST_CASE("exclusion never picks loopback and leaves out the listed names", "[interfaces]") {
  const auto all = list_interfaces();
  // Whatever else this host has, neither lo nor an excluded name comes back.
  try {
    const NetInterface i = pick_interface("^lo", all);
    CHECK_FALSE(i.loopback);
  } catch (const ddp::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("DDP_SOCKET_IFNAME='^lo'"));
  }
  CHECK_THROWS_AS(pick_interface("^nosuch", {{"lo", 1, true, true, "127.0.0.1"}}), ddp::Error);

  CHECK(pick_interface("^eth", a_host()).name == "ib0");
  CHECK(pick_interface("^eth,ib", a_host()).name == "docker0");
  CHECK(pick_interface("^=eth0", a_host()).name == "eth1");  // exact: eth1 is not excluded
  CHECK(pick_interface("^docker,eth0", a_host()).name == "eth1");
}

TEST_CASE("the first admitted interface in index order that is up with IPv4 wins", "[interfaces]") {
  CHECK(pick_interface("eth", a_host()).ipv4 == "10.0.0.5");
  CHECK(pick_interface("ib,eth", a_host()).name == "eth0");  // the host's order, not the list's
  CHECK(pick_interface("=eth1", a_host()).ipv4 == "192.168.7.5");
  CHECK(pick_interface("eth2,eth3,ib", a_host()).name == "ib0");  // down, no IPv4, then ib0
  CHECK_THROWS_WITH(pick_interface("eth2,eth3", a_host()),
                    Catch::Contains("eth2 (down)") && Catch::Contains("eth3 (no IPv4 address)"));
}

TEST_CASE("a spec that lists no name is refused by name", "[interfaces]") {
  for (const char* bad : {"^", "=", "^=", ",", "^,,"}) {
    INFO(bad);
    CHECK_THROWS_WITH(InterfaceSpec::parse(bad), Catch::Contains(std::string("DDP_SOCKET_IFNAME='") + bad + "'") &&
                                                     Catch::Contains("names no interface"));
  }
  const InterfaceSpec s = InterfaceSpec::parse("^=eth0,,ib1");
  CHECK(s.exclude);
  CHECK(s.exact);
  CHECK(s.names == std::vector<std::string>{"eth0", "ib1"});
}
