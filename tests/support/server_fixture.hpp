// A StoreServer on its own thread for tests, with an ephemeral port on loopback.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <thread>

#include "rdzv/server.hpp"
#include "rdzv/tcp_store.hpp"

namespace testing {

class ServerThread {
 public:
  // `port` 0: an ephemeral one.
  explicit ServerThread(rdzv::ServerOptions options = {}, uint16_t port = 0) {
    options.host = "127.0.0.1";
    options.port = port;
    server_ = std::make_unique<rdzv::StoreServer>(io_, options);
    token_ = options.token;
    thread_ = std::thread([this] { io_.run(); });
  }
  ~ServerThread() {
    boost::asio::post(io_, [this] { server_->stop(); });
    guard_.reset();
    io_.stop();
    thread_.join();
  }

  uint16_t port() const { return server_->port(); }
  void set_torch_namespace(std::string ns) { server_->set_torch_namespace(std::move(ns)); }
  // The thread the server runs on.
  std::thread::id thread_id() const { return thread_.get_id(); }

  // The server's counters, read on its own thread.
  rdzv::ServerStats stats() {
    std::promise<rdzv::ServerStats> p;
    boost::asio::post(io_, [&] { p.set_value(server_->stats()); });
    return p.get_future().get();
  }

  rdzv::TcpStoreOptions client_options(const std::string& ns = "") const {
    rdzv::TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = port();
    o.token = token_;
    o.ns = ns;
    o.connect_timeout = std::chrono::seconds(5);
    o.io_timeout = std::chrono::seconds(10);
    return o;
  }
  std::unique_ptr<rdzv::TcpStore> client(const std::string& ns = "") const {
    return std::make_unique<rdzv::TcpStore>(client_options(ns));
  }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_ =
      boost::asio::make_work_guard(io_);
  std::unique_ptr<rdzv::StoreServer> server_;
  std::string token_;
  std::thread thread_;
};

}  // namespace testing
