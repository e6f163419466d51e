// ddp::init(): from the launch environment to a process group.
#include "ddp/init.hpp"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cstdlib>
#include <thread>

#include "backend.hpp"
#include "rdzv/prefix_store.hpp"
#include "rdzv/server.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddp {
namespace {

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// The store server rank 0 hosts when no launcher provides one (torchrun-style
// variables, srun, mpirun); it lives as long as the group's store client.
class HostedServer {
 public:
  HostedServer(uint16_t port) {
    rdzv::ServerOptions o;
    o.host = "0.0.0.0";
    o.port = port;
    server_ = std::make_unique<rdzv::StoreServer>(io_, o);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~HostedServer() {
    io_.stop();
    thread_.join();
  }

 private:
  boost::asio::io_context io_;
  std::unique_ptr<rdzv::StoreServer> server_;
  std::thread thread_;
};

// The group's store client and whatever must outlive it.
struct StoreBundle {
  std::unique_ptr<HostedServer> server;
  std::unique_ptr<rdzv::TcpStore> client;
  std::unique_ptr<rdzv::PrefixStore> prefixed;
};

int parse_port(const std::string& text, const char* name) {
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1 || v > 65535) {
    throw LaunchEnvError(std::string(name) + "='" + text + "' is not a port number");
  }
  return static_cast<int>(v);
}

// True when every rank of the group says `mine` (each publishes under `prefix`).
bool agree_all(rdzv::Store& store, const std::string& prefix, int rank, int size, bool mine, Millis timeout) {
  const auto all = detail::exchange_all(store, prefix, rank, size, mine ? "1" : "0", timeout);
  return std::all_of(all.begin(), all.end(), [](const std::string& v) { return v == "1"; });
}

}  // namespace

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  const LaunchEnv env = LaunchEnv::from_environment();
  detail::GroupSetup setup;
  setup.rank = env.rank;
  setup.size = env.world_size;
  setup.local_rank = env.local_rank;
  setup.local_size = env.local_world_size;
  setup.timeout = options.timeout;
  setup.connect_timeout = options.connect_timeout;
  if (const auto t = env_or("DDP_TIMEOUT_SEC"); !t.empty()) {
    char* end = nullptr;
    const double sec = std::strtod(t.c_str(), &end);
    if (*end != '\0' || !(sec > 0) || sec > 1e9) {
      throw LaunchEnvError("DDP_TIMEOUT_SEC='" + t + "' is not a number of seconds in (0, 1e9]");
    }
    setup.timeout = Millis(static_cast<long long>(sec * 1000));
  }

  auto bundle = std::make_shared<StoreBundle>();
  rdzv::TcpStoreOptions so;
  so.connect_timeout = std::chrono::duration_cast<rdzv::Millis>(options.connect_timeout);
  std::string prefix;
  if (const auto addr = env_or("DDPRUN_STORE_ADDR"); !addr.empty()) {
    // Under ddprun: the launcher's store, this run and attempt's key prefix.
    so.host = addr;
    so.port = static_cast<uint16_t>(parse_port(env_or("DDPRUN_STORE_PORT"), "DDPRUN_STORE_PORT"));
    so.token = env_or("DDPRUN_STORE_TOKEN");
    so.ns = env_or("DDPRUN_STORE_NAMESPACE");
    prefix = env_or("DDPRUN_STORE_PREFIX") + "pg/";
  } else {
    // Elsewhere rank 0 hosts the store at MASTER_ADDR, on MASTER_PORT or (under
    // torchrun's agent, which holds MASTER_PORT) on the port every rank derives.
    so.host = env.master_addr;
    so.port = static_cast<uint16_t>(env.store_port);
    if (env.rank == 0) {
      try {
        bundle->server = std::make_unique<HostedServer>(so.port);
      } catch (const rdzv::StoreError& e) {
        const std::string which = env.store_port == env.master_port
                                      ? "(MASTER_PORT)"
                                      : "(derived from MASTER_PORT and the run id: torchrun's own store is on " +
                                            std::to_string(env.master_port) + ")";
        throw Error("rank 0 cannot host the store on port " + std::to_string(so.port) + " " + which + ": " + e.what());
      }
    }
    prefix = "ddp/" + env.run_id + "/" + std::to_string(env.restart_count) + "/pg/";
  }
  try {
    bundle->client = std::make_unique<rdzv::TcpStore>(so);
  } catch (const rdzv::StoreError& e) {
    throw Error("cannot reach the store at " + so.host + ":" + std::to_string(so.port) + ": " + e.what());
  }
  setup.advertise_host = bundle->client->local_address();
  bundle->prefixed = std::make_unique<rdzv::PrefixStore>(prefix, *bundle->client);
  setup.store = std::shared_ptr<rdzv::Store>(bundle, bundle->prefixed.get());

  std::string backend = options.backend;
  if (const auto b = env_or("DDP_BACKEND"); !b.empty()) backend = b;
  try {
    if (backend == "auto") {
      // Host buffers on the cpu backend; where every rank has a GPU of its own, GPU
      // buffers on nccl too. Every rank must choose alike (a node without GPUs, or
      // with fewer than its ranks, makes the whole job cpu only).
      const bool nccl = agree_all(*setup.store, "auto/nccl/", setup.rank, setup.size,
                                  detail::nccl_usable(setup.local_size), setup.connect_timeout);
      auto host = detail::make_cpu_group(detail::with_store_prefix(setup, "cpu/"));
      if (!nccl) return host;
      return detail::make_routed_group(std::move(host), detail::make_nccl_group(detail::with_store_prefix(setup, "nccl/")));
    }
    if (backend == "cpu") return detail::make_cpu_group(setup);
    if (backend == "nccl") return detail::make_nccl_group(setup);
  } catch (const rdzv::StoreError& e) {
    throw Error(std::string("process group: ") + e.what());
  }
  throw InvalidArgument("unknown backend '" + backend + "' (expected cpu, nccl or auto)");
}

}  // namespace ddp
