// Who hosts the store at a c10d endpoint: the host matching rule (pure), and hosting
// on a real port (a bind that fails makes a client, or with is_host=true an error).
#include "store/endpoint_store.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "errors.hpp"
#include "plan/local_host.hpp"
#include "rdzv/server.hpp"

using ddprun::HostMatch;
using ddprun::match_endpoint_host;
using ddprun::ThisMachine;

namespace {

ThisMachine node0() {
  ThisMachine me;
  me.hostname = "node0";
  me.fqdn = "node0.job.default.svc.cluster.local";
  me.addresses = {"127.0.0.1", "10.250.0.1", "::1", "fe80::1"};
  return me;
}

// The local addresses that listen on `port`, as the kernel lists them in /proc/net/tcp
// and tcp6 (hex, e.g. 0100007F for 127.0.0.1 and 00000000 for every IPv4 address).
std::vector<std::string> listening_on(int port) {
  char port_hex[8];
  std::snprintf(port_hex, sizeof(port_hex), "%04X", port);
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.find(':');
      if (state == "0A" && colon != std::string::npos && local.substr(colon + 1) == port_hex) {
        found.push_back(local.substr(0, colon));
      }
    }
  }
  return found;
}

}  // namespace

TEST_CASE("endpoint host: names match this host's name or FQDN, in any case", "[endpoint]") {
  CHECK(match_endpoint_host("node0", {}, node0()).matches);  // does not resolve yet: the name alone
  CHECK(match_endpoint_host("NODE0", {"10.250.0.1"}, node0()).matches);
  HostMatch fqdn = match_endpoint_host("node0.job.default.svc.cluster.local", {}, node0());
  CHECK(fqdn.matches);
  CHECK_THAT(fqdn.why, Catch::Contains("FQDN"));
  HostMatch other = match_endpoint_host("node1", {}, node0());
  CHECK_FALSE(other.matches);
  CHECK_THAT(other.why, Catch::Contains("does not resolve (yet)"));
  CHECK_FALSE(match_endpoint_host("node", {}, node0()).matches);  // a prefix is another name
  // A Kubernetes pod's <host>.<subdomain>: the resolver's search list completes it to the FQDN.
  HostMatch pod = match_endpoint_host("node0.job", {}, node0());
  CHECK(pod.matches);
  CHECK_THAT(pod.why, Catch::Contains("begins this host's FQDN"));
  CHECK_FALSE(match_endpoint_host("node0.jo", {}, node0()).matches);  // labels whole, not cut
  CHECK_FALSE(match_endpoint_host("node0.other", {}, node0()).matches);
}

TEST_CASE("endpoint host: addresses match an interface's, loopback always", "[endpoint]") {
  HostMatch ip = match_endpoint_host("10.250.0.1", {"10.250.0.1"}, node0());
  CHECK(ip.matches);
  CHECK(ip.why == "10.250.0.1 is an address of this host");
  HostMatch alias = match_endpoint_host("rdzv", {"10.250.0.2", "10.250.0.1"}, node0());
  CHECK(alias.matches);
  CHECK_THAT(alias.why, Catch::Contains("resolves to 10.250.0.1"));
  CHECK_FALSE(match_endpoint_host("10.250.0.2", {"10.250.0.2"}, node0()).matches);
  HostMatch elsewhere = match_endpoint_host("rdzv", {"10.250.0.2"}, node0());
  CHECK_FALSE(elsewhere.matches);
  CHECK_THAT(elsewhere.why, Catch::Contains("neither this host's name node0 nor one of its addresses"));
  CHECK(match_endpoint_host("localhost", {}, node0()).matches);
  CHECK(match_endpoint_host("127.0.0.5", {"127.0.0.5"}, node0()).matches);
  CHECK(match_endpoint_host("::1", {"::1"}, node0()).matches);
  CHECK(match_endpoint_host("fe80::1", {"fe80::1"}, node0()).matches);
  // A name this host's hosts file maps to a loopback address (Debian's 127.0.1.1) is this host.
  CHECK(match_endpoint_host("me-too", {"127.0.1.1"}, node0()).matches);
}

TEST_CASE("endpoint host: this machine as the system sees it", "[endpoint]") {
  ThisMachine me = ddprun::this_machine();
  CHECK(me.hostname == ddprun::local_hostname());
  CHECK(std::find(me.addresses.begin(), me.addresses.end(), "127.0.0.1") != me.addresses.end());
  CHECK(match_endpoint_host(me.hostname, ddprun::resolve_addresses(me.hostname), me).matches);
  CHECK(ddprun::resolve_addresses("127.0.0.1") == std::vector<std::string>{"127.0.0.1"});
  CHECK(ddprun::resolve_addresses("no-such-host.invalid").empty());
}

TEST_CASE("endpoint store: the matching node hosts, a taken port makes it a client, is_host decides", "[endpoint]") {
  ddprun::EndpointStoreOptions o;
  o.host = "127.0.0.1";
  o.server.token = "t";
  // A free port: bind an ephemeral one, then hand it over.
  boost::asio::io_context io;
  rdzv::ServerOptions taken;
  taken.host = "0.0.0.0";
  auto squatter = std::make_unique<rdzv::StoreServer>(io, taken);
  o.port = squatter->port();

  ddprun::EndpointStore client = ddprun::host_endpoint_store(o);  // matches, but the port is taken
  CHECK_FALSE(client.host);
  CHECK_THAT(client.role, Catch::StartsWith("a client of the store at 127.0.0.1:" + std::to_string(o.port)) &&
                              Catch::Contains("is taken"));
  o.is_host = true;
  CHECK_THROWS_WITH(ddprun::host_endpoint_store(o), Catch::Contains("is_host=true in --rdzv_conf, but this node "
                                                                    "cannot host the store on port " +
                                                                    std::to_string(o.port)));
  squatter.reset();
  ddprun::EndpointStore hosted = ddprun::host_endpoint_store(o);
  REQUIRE(hosted.host);
  CHECK(hosted.host->port() == o.port);
  CHECK_THAT(hosted.role, Catch::StartsWith("this node hosts the store") && Catch::Contains("is_host=true"));
  hosted.host.reset();

  o.is_host = false;
  ddprun::EndpointStore told = ddprun::host_endpoint_store(o);
  CHECK_FALSE(told.host);
  CHECK_THAT(told.role, Catch::Contains("is_host=false"));
  o.is_host.reset();
  o.host = "192.0.2.77";  // TEST-NET-1: never this host's
  ddprun::EndpointStore far = ddprun::host_endpoint_store(o);
  CHECK_FALSE(far.host);
  CHECK_THAT(far.role, Catch::Contains("neither this host's name"));
}

TEST_CASE("endpoint store: is_host=true hosts where the endpoint names no address of this host", "[endpoint]") {
  // A Kubernetes Service's cluster IP, say: HOST reaches this node through the network's
  // address translation, and only is_host tells the node it is the one.
  ddprun::EndpointStoreOptions o;
  o.host = "192.0.2.77";  // TEST-NET-1: never this host's
  o.port = 0;             // any free port: what matters is that it binds at all
  o.is_host = true;
  ddprun::EndpointStore hosted = ddprun::host_endpoint_store(o);
  REQUIRE(hosted.host);
  CHECK(hosted.host->port() != 0);
  CHECK_THAT(hosted.role, Catch::StartsWith("this node hosts the store at 192.0.2.77:0 (is_host=true in --rdzv_conf)"));
}

TEST_CASE("endpoint store: a loopback host listens on loopback only, a single node's store takes a token",
          "[endpoint]") {
  ddprun::EndpointStoreOptions o;
  o.host = "localhost";
  o.port = 0;  // any free port
  o.single_node = true;
  ddprun::EndpointStore local = ddprun::host_endpoint_store(o);
  REQUIRE(local.host);
  CHECK(listening_on(local.host->port()) == std::vector<std::string>{"0100007F"});  // 127.0.0.1, nothing else
  CHECK(local.host->token().size() >= 16);  // generated: the store takes nobody without it
  CHECK_THAT(local.role, Catch::Contains("listening on 127.0.0.1 only") && Catch::Contains("generated token"));
  local.host.reset();

  o.server.token = "given";  // a configured token is kept
  ddprun::EndpointStore configured = ddprun::host_endpoint_store(o);
  REQUIRE(configured.host);
  CHECK(configured.host->token() == "given");
  configured.host.reset();

  // Several nodes, and a host other nodes reach: every address, the token as configured.
  o.server.token.clear();
  o.single_node = false;
  o.host = "192.0.2.77";  // TEST-NET-1: never this host's
  o.is_host = true;
  ddprun::EndpointStore shared = ddprun::host_endpoint_store(o);
  REQUIRE(shared.host);
  CHECK(listening_on(shared.host->port()) == std::vector<std::string>{"00000000"});
  CHECK(shared.host->token().empty());
}
