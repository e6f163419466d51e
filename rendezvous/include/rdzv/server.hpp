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
#include <memory>
#include <string>

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
};

struct ServerStats {
  size_t connections = 0;
  size_t namespaces = 0;
  size_t waiters = 0;
  size_t bytes = 0;  // what namespaces, their keys and values, and wills take in memory
  size_t held = 0;   // the rest of the memory budget in use: connections, partial requests, blocked requests, queued replies
  size_t trims = 0;  // times free heap memory was handed back to the system (malloc_trim)
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

 private:
  std::shared_ptr<ServerCore> impl_;
};

}  // namespace rdzv
