// Where torch workers find their store (worker_store.hpp).
#include "store/worker_store.hpp"

#include <boost/asio/ip/address.hpp>
#include <spdlog/spdlog.h>

#include "plan/local_host.hpp"
#include "plan/ports.hpp"
#include "rdzv/token.hpp"

namespace ddprun {

std::string single_node_store_address(const std::string& master_addr) {
  if (master_addr == "localhost") return "127.0.0.1";
  boost::system::error_code ec;
  boost::asio::ip::make_address(master_addr, ec);
  if (!ec) return master_addr;
  for (const std::string& address : resolve_addresses(master_addr)) {
    if (foreign_address_reason(address).empty()) return address;
  }
  return "127.0.0.1";
}

int WorkerStore::offer_port(const std::string& address) {
  if (!agent_store_) return pick_free_port();
  if (job_store_ != nullptr) return job_store_->port();
  if (!torch_only_) {
    rdzv::ServerOptions server;
    server.host = address;
    server.port = 0;
    // Only torch clients: nobody holds this token. Their namespace comes with the first attempt.
    server.token = rdzv::generate_token();
    torch_only_ = std::make_unique<StoreHost>(server);
    if (verbose_) spdlog::info("agent store: serving this job's torch workers (unauthenticated, torch's protocol) at {}:{}",
                 address, torch_only_->port());
  }
  return torch_only_->port();
}

std::string WorkerStore::torch_namespace(const std::string& agent_ns, int attempt) {
  return agent_ns + "/torch/attempt_" + std::to_string(attempt);
}

void WorkerStore::serve_attempt(const std::string& agent_ns, int attempt) {
  if (!agent_store_) return;
  const std::string ns = torch_namespace(agent_ns, attempt);
  if (job_store_ != nullptr) job_store_->set_torch_namespace(ns);
  if (torch_only_) torch_only_->set_torch_namespace(ns);
}

}  // namespace ddprun
