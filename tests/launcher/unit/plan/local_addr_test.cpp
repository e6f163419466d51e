// --local_addr: the address a node advertises must be one of its own. An IP address
// is checked by binding it; a host name is passed on as given (as torchrun does).
#include <catch2/catch.hpp>

#include "plan/ports.hpp"

using ddprun::foreign_address_reason;

TEST_CASE("an address of this host is accepted and one elsewhere says why not", "[local_addr]") {
  CHECK(foreign_address_reason("127.0.0.1").empty());
  CHECK(foreign_address_reason("127.0.0.5").empty());  // all of 127/8 is this host's
  // 198.51.100.0/24 is reserved for documentation (TEST-NET-2; some test machines use TEST-NET-1).
  CHECK_THAT(foreign_address_reason("198.51.100.7"), Catch::Contains("Cannot assign requested address"));
  CHECK_THAT(foreign_address_reason("2001:db8::7"), !Catch::Equals(""));
}

TEST_CASE("a host name is not checked here", "[local_addr]") {
  CHECK(foreign_address_reason("node-a.cluster").empty());
  CHECK(foreign_address_reason("10.0.0").empty());  // not a dotted quad: a name to the resolver
}
