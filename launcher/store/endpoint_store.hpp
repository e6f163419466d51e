// torchrun's c10d endpoint (--rdzv_endpoint HOST[:PORT]): the node that HOST names
// hosts the job's store there, unless a ddp-rendezvous daemon (or another ddprun of
// the job on the same host) already listens on PORT; `is_host` in --rdzv_conf decides
// instead where given. Every node, the host included, then uses the store at the
// endpoint as a daemon's client (its namespace is the run id), so a daemon and a
// hosted store are one code path.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdzv/server.hpp"
#include "store/store_host.hpp"

namespace ddprun {

// What this machine answers to.
struct ThisMachine {
  std::string hostname;                // gethostname()
  std::string fqdn;                    // its canonical name, when it resolves to one
  std::vector<std::string> addresses;  // its interfaces' addresses
};

// Asks the system (gethostname, getaddrinfo with AI_CANONNAME, getifaddrs).
ThisMachine this_machine();

// Whether the endpoint's HOST names this machine, and why (for -v): "localhost" or a
// loopback address; HOST equal to the host name or its FQDN, or a dotted name the FQDN
// begins with (a pod's <host>.<subdomain>; names compare without regard to case); one
// of the addresses HOST resolves to (`resolved`) being an interface address or a
// loopback one. A HOST that does not resolve yet can match by name only.
struct HostMatch {
  bool matches = false;
  std::string why;  // "host name node0 matches", "10.0.0.1 is an address of this host", ...
};
HostMatch match_endpoint_host(const std::string& host, const std::vector<std::string>& resolved,
                              const ThisMachine& me);

struct EndpointStoreOptions {
  std::string host;                 // the endpoint's HOST and PORT
  int port = 29400;
  std::optional<bool> is_host;      // --rdzv_conf is_host: decides where given
  rdzv::ServerOptions server;       // token and limits of a store this node hosts (host and port set here)
  bool single_node = false;         // a one-node job: a store it hosts without a token gets a generated one
};

// This node's part at the endpoint: the store it hosts there (or none), and a line
// saying who hosts it and why.
struct EndpointStore {
  std::unique_ptr<StoreHost> host;
  std::string role;
};

// The warning a store this node hosts without a token gets, once: it takes anyone
// who reaches its port (a job's nodes and workers, and anybody else).
void warn_open_store(int port);

// Decides and, when this node is the host, binds PORT: on loopback only for a loopback
// HOST (localhost, 127.x, ::1), else on every address. A bind that fails makes this node
// a client of whatever listens there, as torchrun does; with is_host=true it throws
// LaunchError instead. The hosted store's token is EndpointStore::host->token().
EndpointStore host_endpoint_store(const EndpointStoreOptions& options);

}  // namespace ddprun
