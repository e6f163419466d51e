// The store rank 0 hosts outside ddprun (hosted_store.hpp): the listening address
// chosen from MASTER_ADDR and this host's interfaces, the token, the warning.
#include "hosted_store.hpp"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <boost/asio/ip/address.hpp>
#include <cstdio>
#include <vector>

namespace ddp::detail {
namespace {

namespace ip = boost::asio::ip;

ip::address address_of(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return ip::address_v4(ntohl(in->sin_addr.s_addr));
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
  ip::address_v6::bytes_type bytes;
  std::copy(std::begin(in6->sin6_addr.s6_addr), std::end(in6->sin6_addr.s6_addr), bytes.begin());
  return ip::address_v6(bytes, in6->sin6_scope_id);
}

// What `name` resolves to, in the order a client tries them (empty if it does not).
std::vector<ip::address> resolve(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::vector<ip::address> out;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) return out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET || a->ai_family == AF_INET6) out.push_back(address_of(a->ai_addr));
  }
  ::freeaddrinfo(found);
  return out;
}

// The addresses of this host's interfaces.
std::vector<ip::address> interface_addresses() {
  ifaddrs* list = nullptr;
  std::vector<ip::address> out;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6)) {
      out.push_back(address_of(i->ifa_addr));
    }
  }
  ::freeifaddrs(list);
  return out;
}

bool same_host_address(const ip::address& a, const ip::address& b) {
  if (a.is_v6() && b.is_v6()) return a.to_v6().to_bytes() == b.to_v6().to_bytes();  // scope aside
  return a == b;
}

}  // namespace

std::string hosted_store_address(const std::string& master_addr, bool single_host) {
  const auto local = interface_addresses();
  for (const auto& a : resolve(master_addr)) {
    // No other host reaches a loopback address (Debian maps the host's own name to
    // 127.0.1.1: the other hosts know it by another address).
    if (a.is_loopback() && !single_host) continue;
    // All of 127.0.0.0/8 is this host's; ::1 only where lo has IPv6.
    if (a.is_v4() && a.is_loopback()) return a.to_string();
    for (const auto& l : local) {
      if (same_host_address(a, l)) return a.to_string();
    }
  }
  return "0.0.0.0";
}

HostedStore::HostedStore(const HostedStoreOptions& options)
    : address_(hosted_store_address(options.master_addr, options.single_host)) {
  rdzv::ServerOptions o;
  o.host = address_;
  o.port = options.port;
  o.token = options.token;
  server_ = std::make_unique<rdzv::StoreServer>(io_, o);
  if (options.token.empty()) {
    // Worded as ddprun's own warning for the store it hosts for several nodes.
    std::fprintf(stderr,
                 "ddp: warning: the rendezvous store rank 0 hosts on %s:%u accepts anyone who can reach it; set "
                 "DDPRUN_TOKEN on every rank to require a shared token\n",
                 address_.c_str(), static_cast<unsigned>(options.port));
  }
  thread_ = std::thread([this] { io_.run(); });
}

HostedStore::~HostedStore() {
  io_.stop();
  thread_.join();
}

}  // namespace ddp::detail
