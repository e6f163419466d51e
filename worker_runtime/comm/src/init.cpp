// ddp::init(): from the launch environment to a process group.
#include "ddp/init.hpp"

#include <algorithm>
#include <cstdio>

#include "group_setup.hpp"
#include "cpu/interfaces.hpp"
#include "ddp/contract/store_keys.hpp"
#include "hosted_store.hpp"
#include "job_link.hpp"
#include "rdzv/prefix_store.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddp {
namespace {

// The group's store client and whatever must outlive it.
struct StoreBundle {
  std::unique_ptr<detail::HostedStore> server;
  std::shared_ptr<const detail::JobLink> job;  // under ddprun: the process's link
  std::shared_ptr<rdzv::TcpStore> client;
  std::unique_ptr<rdzv::PrefixStore> prefixed;
};

// True when every rank of the group says `mine` (each publishes under `prefix`).
bool agree_all(const detail::GroupSetup& setup, const std::string& prefix, bool mine) {
  const auto all = detail::exchange_all(*setup.store, prefix, setup.rank, setup.size, mine ? "1" : "0",
                                        setup.connect_timeout, setup.peers);
  return std::all_of(all.begin(), all.end(), [](const std::string& v) { return v == "1"; });
}

using Clock = std::chrono::steady_clock;

}  // namespace

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  const contract::WorkerEnv env = contract::WorkerEnv::from_environment();
  // Read (and checked) here, before anything connects: a malformed DDP_* variable is
  // one clear error, not a failure inside a backend.
  const contract::CommSettings settings = contract::CommSettings::from_environment();
  detail::GroupSetup setup;
  setup.rank = env.rank;
  setup.size = env.world_size;
  setup.local_rank = env.local_rank;
  setup.local_size = env.local_world_size;
  setup.timeout = options.timeout;
  // DDP_TIMEOUT_SEC bounds everything a rank can wait for: collectives, and the
  // store and the peers at start.
  const Millis connect_timeout = settings.timeout.value_or(options.connect_timeout);
  const auto deadline = Clock::now() + connect_timeout;
  if (settings.timeout) setup.timeout = *settings.timeout;
  setup.peers.me = env.rank;
  setup.peers.notice_every = settings.wait_notice_every;
  // DDP_SOCKET_IFNAME: chosen before anything connects, so a name that matches no
  // interface is the rank's one error, at once.
  if (settings.socket_ifname) {
    setup.bind_host = cpu::pick_interface(*settings.socket_ifname, cpu::list_interfaces()).ipv4;
  }

  auto bundle = std::make_shared<StoreBundle>();
  rdzv::TcpStoreOptions so;
  std::string prefix;
  if (env.store) {
    // Under ddprun: the launcher's store through the process's one link, this
    // attempt's process-group prefix.
    bundle->job = detail::job_link(env, deadline, settings.wait_notice_every);
    bundle->client = bundle->job->store;
    setup.peers.exits = bundle->job->exits;
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
    bundle->client = detail::connect_store(so, env.rank, deadline, settings.wait_notice_every);
  }
  setup.connect_timeout = std::max(Millis(1), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
  // Peers on other hosts reach this rank where it reaches the store, unless told otherwise.
  setup.advertise_host = setup.bind_host.empty() ? bundle->client->local_address() : setup.bind_host;
  bundle->prefixed = std::make_unique<rdzv::PrefixStore>(prefix, *bundle->client);
  setup.store = std::shared_ptr<rdzv::Store>(bundle, bundle->prefixed.get());

  const std::string backend = settings.backend.value_or(options.backend);
  try {
    if (backend == "auto") {
      // Host buffers on the cpu backend; where every rank has a GPU of its own, GPU
      // buffers on nccl too. Every rank must choose alike (a node without GPUs, or
      // with fewer than its ranks, makes the whole job cpu only).
      const bool nccl = agree_all(setup, contract::group_keys::exchange(contract::group_keys::kAutoNccl),
                                  detail::nccl_usable(setup.local_size));
      auto host = detail::make_cpu_backend(detail::with_store_prefix(setup, contract::group_keys::backend("cpu")));
      if (!nccl) return std::make_shared<ProcessGroup>(std::move(host));
      auto gpu = detail::make_nccl_backend(detail::with_store_prefix(setup, contract::group_keys::backend("nccl")));
      return std::make_shared<ProcessGroup>(detail::make_routed_backend(std::move(host), std::move(gpu)));
    }
    if (backend == "cpu") return std::make_shared<ProcessGroup>(detail::make_cpu_backend(setup));
    if (backend == "nccl") return std::make_shared<ProcessGroup>(detail::make_nccl_backend(setup));
  } catch (const rdzv::StoreError& e) {
    throw Error(std::string("process group: ") + e.what());
  }
  throw InvalidArgument("unknown backend '" + backend + "' (expected cpu, nccl or auto)");
}

}  // namespace ddp
