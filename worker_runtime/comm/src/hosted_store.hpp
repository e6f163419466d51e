// The store rank 0 hosts when no launcher provides one (torchrun-style variables,
// srun, mpirun): where it listens, whom it admits, and the warning when that is anyone.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "rdzv/server.hpp"

namespace ddp::detail {

struct HostedStoreOptions {
  std::string master_addr;   // MASTER_ADDR: where the other ranks will connect
  uint16_t port = 0;         // the port every rank derives (WorkerEnv::store_port)
  std::string token;         // DDPRUN_TOKEN; empty: no authentication (and a warning)
  bool single_host = false;  // every rank runs on this host
};

// The address to listen on for `master_addr`: that address itself when it is one of
// this host's (a name is resolved; a loopback address only when every rank is on
// this host, since no other host can reach it), else every interface ("0.0.0.0").
std::string hosted_store_address(const std::string& master_addr, bool single_host);

// Binds at once and serves on its own thread until destroyed. Throws StoreError when
// it cannot bind. Without a token it prints one warning line on stderr.
class HostedStore {
 public:
  explicit HostedStore(const HostedStoreOptions& options);
  ~HostedStore();
  HostedStore(const HostedStore&) = delete;
  HostedStore& operator=(const HostedStore&) = delete;

  const std::string& address() const { return address_; }  // what it listens on

 private:
  boost::asio::io_context io_;
  std::string address_;
  std::unique_ptr<rdzv::StoreServer> server_;
  std::thread thread_;
};

}  // namespace ddp::detail
