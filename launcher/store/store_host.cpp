#include "store/store_host.hpp"

#include <boost/asio/post.hpp>

#include <spdlog/spdlog.h>

#include "errors.hpp"

namespace ddprun {

StoreHost::StoreHost(rdzv::ServerOptions options) : work_(boost::asio::make_work_guard(io_)) {
  // torch's clients expect an attempt's keys to last while its store does, whoever
  // connects or leaves meanwhile.
  options.hold_torch_namespace = true;
  try {
    server_ = std::make_unique<rdzv::StoreServer>(io_, options);
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(e.what());
  }
  port_ = server_->port();
  token_ = options.token;
  thread_ = std::thread([this] {
    // The server turns client misbehaviour into errors for that client; anything that
    // still escapes is logged and serving goes on, rather than taking ddprun down.
    while (true) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("rendezvous store: {}", e.what());
      }
    }
  });
}

StoreHost::~StoreHost() {
  boost::asio::post(io_, [this] { server_->stop(); });
  work_.reset();
  io_.stop();
  thread_.join();
}

}  // namespace ddprun
