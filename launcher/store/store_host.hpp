// The rendezvous store embedded in ddprun: a StoreServer on its own thread, so it
// keeps serving the other nodes while this ddprun blocks in the rendezvous or runs
// its workers.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <thread>

#include "rdzv/server.hpp"

namespace ddprun {

class StoreHost {
 public:
  // Listens at once; throws LaunchError when the address or port cannot be bound.
  explicit StoreHost(rdzv::ServerOptions options);
  ~StoreHost();  // stops the server and joins its thread
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

  uint16_t port() const { return port_; }
  const std::string& token() const { return token_; }
  // Torch clients (TCPStore's protocol) that connect from now on go to namespace `ns`
  // (empty: refused); its keys stay, connected or not, until the next call moves on
  // (ServerOptions::hold_torch_namespace). Safe from any thread.
  void set_torch_namespace(std::string ns) { server_->set_torch_namespace(std::move(ns)); }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::unique_ptr<rdzv::StoreServer> server_;
  uint16_t port_ = 0;
  std::string token_;
  std::thread thread_;
};

}  // namespace ddprun
