#include "store_host.hpp"

#include <boost/asio/post.hpp>

#include "errors.hpp"

namespace ddprun {

StoreHost::StoreHost(rdzv::ServerOptions options) : work_(boost::asio::make_work_guard(io_)) {
  try {
    server_ = std::make_unique<rdzv::StoreServer>(io_, options);
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(e.what());
  }
  port_ = server_->port();
  token_ = options.token;
  thread_ = std::thread([this] { io_.run(); });
}

StoreHost::~StoreHost() {
  boost::asio::post(io_, [this] { server_->stop(); });
  work_.reset();
  io_.stop();
  thread_.join();
}

}  // namespace ddprun
