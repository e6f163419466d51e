// Where torch workers find their store (worker_store.hpp).
#include "store/worker_store.hpp"

#include <boost/asio/ip/address.hpp>
#include <spdlog/spdlog.h>

#include <optional>

#include "plan/local_host.hpp"
#include "plan/ports.hpp"
#include "rdzv/token.hpp"

namespace ddprun {

namespace {

// `name` as an address this host can listen on: an IP address as given, else the first
// of the name's addresses that is this host's; none: nullopt.
std::optional<std::string> own_address(const std::string& name) {
  boost::system::error_code ec;
  boost::asio::ip::make_address(name, ec);
  if (!ec) return name;
  for (const std::string& address : resolve_addresses(name)) {
    if (foreign_address_reason(address).empty()) return address;
  }
  return std::nullopt;
}

}  // namespace

std::string single_node_store_address(const std::string& master_addr) {
  if (master_addr == "localhost") return "127.0.0.1";
  return own_address(master_addr).value_or("127.0.0.1");
}

int WorkerStore::offer_port(const std::string& address) {
  if (!agent_store_) return pick_free_port();
  if (job_store_ != nullptr) return job_store_->port();
  if (!torch_only_) {
    rdzv::ServerOptions server;
    // `address` is what the other nodes reach this one at (--local_addr may be a host name).
    server.host = own_address(address).value_or("0.0.0.0");
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
