// ddp::init(): from the launch environment to a process group.
#include "ddp/init.hpp"

#include <algorithm>

#include "backend.hpp"
#include "ddp/contract/store_keys.hpp"
#include "hosted_store.hpp"
#include "progress_publisher.hpp"
#include "rdzv/prefix_store.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddp {
namespace {

// The group's store client and whatever must outlive it.
struct StoreBundle {
  std::unique_ptr<detail::HostedStore> server;
  std::unique_ptr<rdzv::TcpStore> client;
  std::unique_ptr<rdzv::PrefixStore> prefixed;
};

// True when every rank of the group says `mine` (each publishes under `prefix`).
bool agree_all(rdzv::Store& store, const std::string& prefix, int rank, int size, bool mine, Millis timeout) {
  const auto all = detail::exchange_all(store, prefix, rank, size, mine ? "1" : "0", timeout);
  return std::all_of(all.begin(), all.end(), [](const std::string& v) { return v == "1"; });
}

}  // namespace

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  const contract::WorkerEnv env = contract::WorkerEnv::from_environment();
  // Read (and checked) here, before anything connects: a malformed DDP_* variable is
  // one clear error, not a failure inside a backend.
  const contract::CommSettings settings = contract::CommSettings::from_environment();
  // Under ddprun this rank's progress goes to the job's store from now on (a rank
  // still forming its group shows as alive, with no group yet).
  detail::start_progress_publisher(env);
  detail::GroupSetup setup;
  setup.rank = env.rank;
  setup.size = env.world_size;
  setup.local_rank = env.local_rank;
  setup.local_size = env.local_world_size;
  setup.timeout = options.timeout;
  setup.connect_timeout = options.connect_timeout;
  if (settings.timeout) setup.timeout = *settings.timeout;

  auto bundle = std::make_shared<StoreBundle>();
  rdzv::TcpStoreOptions so;
  so.connect_timeout = std::chrono::duration_cast<rdzv::Millis>(options.connect_timeout);
  std::string prefix;
  if (env.store) {
    // Under ddprun: the launcher's store, this attempt's process-group prefix.
    so.host = env.store->addr;
    so.port = static_cast<uint16_t>(env.store->port);
    so.token = env.store->token;
    so.ns = env.store->ns;
    prefix = env.store->prefix;
  } else {
    // Elsewhere rank 0 hosts the store at MASTER_ADDR, on MASTER_PORT or (under
    // torchrun's agent, which holds MASTER_PORT) on the port every rank derives.
    // It listens on MASTER_ADDR where that is this host's, and requires DDPRUN_TOKEN
    // when one is given.
    so.host = env.master_addr;
    so.port = static_cast<uint16_t>(env.store_port());
    so.token = env.token;
    if (env.rank == 0) {
      try {
        bundle->server = std::make_unique<detail::HostedStore>(
            detail::HostedStoreOptions{.master_addr = env.master_addr,
                                       .port = so.port,
                                       .token = env.token,
                                       .single_host = env.local_world_size == env.world_size});
      } catch (const rdzv::StoreError& e) {
        const std::string which = env.store_port() == env.master_port
                                      ? "(MASTER_PORT)"
                                      : "(derived from MASTER_PORT and the run id: torchrun's own store is on " +
                                            std::to_string(env.master_port) + ")";
        throw Error("rank 0 cannot host the store on port " + std::to_string(so.port) + " " + which + ": " + e.what());
      }
    }
    prefix = contract::JobKeys::standalone_process_groups(env.run_id, env.restart_count);
  }
  try {
    bundle->client = std::make_unique<rdzv::TcpStore>(so);
  } catch (const rdzv::StoreError& e) {
    throw Error("cannot reach the store at " + so.host + ":" + std::to_string(so.port) + ": " + e.what());
  }
  setup.advertise_host = bundle->client->local_address();
  bundle->prefixed = std::make_unique<rdzv::PrefixStore>(prefix, *bundle->client);
  setup.store = std::shared_ptr<rdzv::Store>(bundle, bundle->prefixed.get());

  const std::string backend = settings.backend.value_or(options.backend);
  try {
    if (backend == "auto") {
      // Host buffers on the cpu backend; where every rank has a GPU of its own, GPU
      // buffers on nccl too. Every rank must choose alike (a node without GPUs, or
      // with fewer than its ranks, makes the whole job cpu only).
      const bool nccl = agree_all(*setup.store, contract::group_keys::exchange(contract::group_keys::kAutoNccl), setup.rank, setup.size,
                                  detail::nccl_usable(setup.local_size), setup.connect_timeout);
      auto host = detail::make_cpu_group(detail::with_store_prefix(setup, contract::group_keys::backend("cpu")));
      if (!nccl) return host;
      auto gpu = detail::make_nccl_group(detail::with_store_prefix(setup, contract::group_keys::backend("nccl")));
      return detail::make_routed_group(std::move(host), std::move(gpu));
    }
    if (backend == "cpu") return detail::make_cpu_group(setup);
    if (backend == "nccl") return detail::make_nccl_group(setup);
  } catch (const rdzv::StoreError& e) {
    throw Error(std::string("process group: ") + e.what());
  }
  throw InvalidArgument("unknown backend '" + backend + "' (expected cpu, nccl or auto)");
}

}  // namespace ddp
