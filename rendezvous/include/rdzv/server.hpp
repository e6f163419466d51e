// The store server: one implementation, embedded in node 0's ddprun and run
// standalone as ddp-rendezvous. Single-threaded on the caller's io_context:
// thousands of connections, waits served by wake-ups (a set wakes exactly the
// waiters on that key) and cancelled when they time out or their client goes away.
//
// Each connection names a namespace when it authenticates and sees only that
// namespace's keys, so one daemon serves many jobs. A namespace's keys are dropped
// when its last connection closes.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "rdzv/server_counters.hpp"
#include "rdzv/store.hpp"

namespace rdzv {

class ServerCore;

struct ServerOptions {
  std::string host = "0.0.0.0";            // address to listen on ("127.0.0.1": this host only)
  uint16_t port = 0;                       // 0: an ephemeral port, see StoreServer::port()
  std::string token;                       // the shared token: opens every namespace
  std::string secret;                      // job_credential(secret, ns) opens namespace ns only
                                           // (token and secret both empty: no authentication)
  size_t max_connections = 100000;         // more are refused with an error frame
  // Bytes held for clients, all namespaces together: keys and values (wills included),
  // partly read requests, blocked requests, queued replies (PROTOCOL.md, "Limits").
  size_t max_memory = size_t{1} << 30;
  uint32_t max_value = 16u << 20;          // bytes in one value
  Millis heartbeat_timeout{10000};         // a silent, unreachable peer is dropped after this (0: never)
  // PyTorch's TCPStore clients (torch.distributed.TCPStore, both wire dialects) have no
  // authentication: each is confined to this one namespace. Empty: they are refused, and
  // the server greets every connection at once as before (PROTOCOL.md, "torch's dialects").
  std::string torch_namespace;
  // Keeps the current torch_namespace and its keys while no connection is in it, as
  // torch's own server keeps every key while it lives, until set_torch_namespace() moves
  // on (then the old one goes as its last connection leaves) or the server stops.
  // false: a namespace goes with its last connection, the torch one too (the daemon,
  // so that the next job of the same id starts clean).
  bool hold_torch_namespace = false;
  // Called on the server's thread once for each torch connection admitted, with the
  // peer's address, its dialect and the namespace it joined (ddp-rendezvous logs it).
  std::function<void(const std::string& peer, Dialect dialect, const std::string& ns)> on_torch_client;
  // Called on the server's thread once for each torch connection refused because no torch
  // namespace is set, with the peer's address (ddp-rendezvous logs it).
  std::function<void(const std::string& peer)> on_torch_refused;
};

struct ServerStats {
  size_t connections = 0;
  size_t namespaces = 0;
  size_t waiters = 0;
  size_t bytes = 0;  // what namespaces, their keys and values, and wills take in memory
  size_t held = 0;   // the rest of the memory budget in use: connections, partial requests, blocked requests, queued replies
  size_t trims = 0;  // times free heap memory was handed back to the system (malloc_trim)
  size_t keys = 0;        // stored keys, all namespaces together
  size_t max_memory = 0;  // the budget bytes and held are charged against
  ServerCounters counters;  // since the server started (ddp-rendezvous --metrics-port)
};

class StoreServer {
 public:
  // Binds and listens at once; throws StoreError when it cannot (port in use, bad host).
  StoreServer(boost::asio::io_context& io, ServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  ServerStats stats() const;

  // Stops accepting and closes every connection; pending waits end with the connection.
  void stop();

  // Replaces ServerOptions::token and ::secret for connections that authenticate from
  // now on; connections already authenticated keep going. Safe from any thread.
  void set_credentials(std::string token, std::string secret);

  // Replaces ServerOptions::torch_namespace for torch connections that arrive from now
  // on (ddprun moves its torch workers to each attempt's namespace); with
  // ServerOptions::hold_torch_namespace, holds the new one and lets go of the old one.
  // Safe from any thread.
  void set_torch_namespace(std::string ns);

  // Opens one more port (0: an ephemeral one; returns it) on ServerOptions::host, served
  // by this server with its one memory budget: its torch clients join namespace `ns`,
  // its ddprun clients authenticate as on the first port. Throws StoreError when it
  // cannot listen. Call before the io_context runs, or on its thread.
  uint16_t add_torch_listener(uint16_t port, std::string ns);

 private:
  std::shared_ptr<ServerCore> impl_;
};

}  // namespace rdzv
