#include "store/store_reader.hpp"

#include <spdlog/spdlog.h>

#include "ddp/contract/store_keys.hpp"
#include "errors.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddprun {

StoreReader::StoreReader(const StoreReaderOptions& options) : options_(options) {
  rdzv::TcpStoreOptions o;
  o.host = options.host;
  o.port = options.port;
  o.token = options.token;
  o.ns = options.ns;
  o.connect_timeout = std::chrono::milliseconds(5000);
  o.io_timeout = std::chrono::milliseconds(2000);
  try {
    store_ = std::make_shared<rdzv::TcpStore>(o);
  } catch (const std::exception& e) {
    throw LaunchError(std::string("cannot connect to this ddprun's own store: ") + e.what());
  }
}

bool StoreReader::any_node_in(int attempt) {
  const ddp::contract::JobKeys keys(attempt);
  for (int r = 0; r < options_.nnodes; ++r) {
    if (store_->check({keys.node(r)})) return true;
  }
  return false;
}

int StoreReader::latest_attempt() {
  if (!store_) return 0;
  try {
    while (latest_ < options_.max_restarts && any_node_in(latest_ + 1)) ++latest_;
  } catch (const std::exception& e) {
    spdlog::warn("cannot read the job's attempts from the store: {}", e.what());
  }
  return latest_;
}

std::optional<FailureNotice> StoreReader::latest_failure() {
  if (!store_) return std::nullopt;
  const int attempt = latest_attempt();
  try {
    const std::string key = ddp::contract::JobKeys(attempt).failure();
    if (store_->check({key})) return FailureNotice::decode(store_->get(key, std::chrono::milliseconds(2000)));
  } catch (const std::exception& e) {
    spdlog::warn("cannot read the job's failure from the store: {}", e.what());
  }
  return std::nullopt;
}

bool StoreReader::joined(int node_rank) {
  if (!store_) return false;
  const int latest = latest_attempt();
  try {
    for (int attempt = 0; attempt <= latest; ++attempt) {
      if (store_->check({ddp::contract::JobKeys(attempt).node(node_rank)})) return true;
    }
  } catch (const std::exception& e) {
    spdlog::warn("cannot read node {}'s registration from the store: {}", node_rank, e.what());
  }
  return false;
}

}  // namespace ddprun
