// Who hosts the store at a c10d endpoint (endpoint_store.hpp).
#include "store/endpoint_store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>

#include <spdlog/spdlog.h>

#include "errors.hpp"
#include "plan/local_host.hpp"
#include "rdzv/token.hpp"

namespace ddprun {
namespace {

bool same_name(const std::string& a, const std::string& b) {
  return !a.empty() && a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](unsigned char x, unsigned char y) {
           return std::tolower(x) == std::tolower(y);
         });
}

bool is_loopback(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, address.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::string canonical_name(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return {};
  std::string name = found->ai_canonname != nullptr ? found->ai_canonname : "";
  freeaddrinfo(found);
  return name;
}

// A loopback HOST is reached through loopback only: the store listens there, not on
// every interface. Any other HOST: every address, as torchrun's TCPStore does.
std::string listen_address(const std::string& host) {
  if (same_name(host, "localhost")) return "127.0.0.1";
  if (is_loopback(host)) return host;
  return host.find(':') != std::string::npos ? "::" : "0.0.0.0";
}

}  // namespace

void warn_open_store(int port) {
  spdlog::warn("the rendezvous store on port {} accepts anyone who can reach it; set DDPRUN_TOKEN (or "
               "--rdzv_token_file) on every node to require a shared token",
               port);
}

ThisMachine this_machine() {
  ThisMachine me;
  me.hostname = local_hostname();
  me.fqdn = canonical_name(me.hostname);
  me.addresses = interface_addresses();
  return me;
}

HostMatch match_endpoint_host(const std::string& host, const std::vector<std::string>& resolved,
                              const ThisMachine& me) {
  if (same_name(host, "localhost") || is_loopback(host)) return {true, host + " is this host's loopback"};
  if (same_name(host, me.hostname)) return {true, "host name " + me.hostname + " matches"};
  if (same_name(host, me.fqdn)) return {true, "this host's FQDN " + me.fqdn + " matches"};
  // A name the resolver's search list completes to this host's FQDN, e.g. a Kubernetes
  // pod's <host>.<subdomain> of <host>.<subdomain>.<namespace>.svc.cluster.local.
  if (me.fqdn.size() > host.size() && me.fqdn[host.size()] == '.' && same_name(host, me.fqdn.substr(0, host.size())) &&
      host.find('.') != std::string::npos) {
    return {true, host + " begins this host's FQDN " + me.fqdn};
  }
  for (const auto& address : resolved) {
    if (std::find(me.addresses.begin(), me.addresses.end(), address) != me.addresses.end()) {
      return {true, address == host ? host + " is an address of this host"
                                    : host + " resolves to " + address + ", an address of this host"};
    }
    if (is_loopback(address)) return {true, host + " resolves to " + address + ", this host's loopback"};
  }
  if (resolved.empty()) return {false, host + " does not resolve (yet) and is not this host's name " + me.hostname};
  return {false, host + " is neither this host's name " + me.hostname + " nor one of its addresses"};
}

EndpointStore host_endpoint_store(const EndpointStoreOptions& o) {
  EndpointStore out;
  const std::string where = o.host + ":" + std::to_string(o.port);
  std::string why;
  if (o.is_host) {
    why = std::string("is_host=") + (*o.is_host ? "true" : "false") + " in --rdzv_conf";
    if (!*o.is_host) {
      out.role = "a client of the store at " + where + " (" + why + ")";
      return out;
    }
  } else {
    HostMatch match = match_endpoint_host(o.host, resolve_addresses(o.host), this_machine());
    why = match.why;
    if (!match.matches) {
      out.role = "a client of the store at " + where + " (" + why + ")";
      return out;
    }
  }
  rdzv::ServerOptions server = o.server;
  server.host = listen_address(o.host);
  // A one-node job needs nobody else: its store takes a token nobody else knows, as
  // the store of a one-node job without an endpoint does.
  if (o.single_node && server.token.empty() && server.secret.empty()) server.token = rdzv::generate_token();
  server.port = static_cast<uint16_t>(o.port);
  try {
    out.host = std::make_unique<StoreHost>(server);
  } catch (const LaunchError& e) {
    if (o.is_host) {
      throw LaunchError("is_host=true in --rdzv_conf, but this node cannot host the store on port " +
                        std::to_string(o.port) + ": " + e.what());
    }
    // A daemon, or another ddprun of this job on this host, listens there: use it.
    out.role = "a client of the store at " + where + " (" + why + ", but port " + std::to_string(o.port) +
               " is taken: " + e.what() + "; a ddp-rendezvous daemon or another ddprun of the job serves it)";
    return out;
  }
  if (server.token.empty() && server.secret.empty()) warn_open_store(o.port);
  const bool everywhere = server.host == "::" || server.host == "0.0.0.0";
  out.role = "this node hosts the store at " + where + " (" + why + ")" +
             (everywhere ? "" : ", listening on " + server.host + " only") +
             (o.single_node && o.server.token.empty() ? ", with a generated token" : "");
  return out;
}

}  // namespace ddprun
