// Where a node's torch workers find their store: MASTER_ADDR:MASTER_PORT and
// TORCHELASTIC_USE_AGENT_STORE, as torchrun 2.x hands them out.
//
// With the agent store (the default) a ddprun serves torch's TCPStore protocol to the
// workers, so init_process_group() from the environment connects as a client and no
// worker binds MASTER_PORT; a restart finds the same port served. Which store:
//   - the job's store this ddprun hosts (one node: on --master_addr, loopback by default,
//     at --master_port; static multi-node: node 0's at --master_port; a c10d endpoint
//     this ddprun hosts: the endpoint's port);
//   - else, on the group-rank-0 node, a torch-only store this ddprun starts on its own
//     address (a ddp-rendezvous daemon, or a c10d endpoint another node hosts: this
//     ddprun cannot tell whether that store admits the job's torch clients). In an
//     elastic job every node that hosts no store starts one when it registers, since
//     any may become member 0; only member 0's is given to the workers.
// Torch clients have no credentials, so each server confines them to one namespace:
// the agents' namespace + "/torch/attempt_<N>", moved before each attempt's workers
// start; they never see the agents' keys nor an earlier attempt's.
//
// Without it (--no_agent_store) MASTER_PORT is a port rank 0 binds for its own store.
#pragma once

#include <memory>
#include <string>

#include "store/store_host.hpp"

namespace ddprun {

// Where a one-node job's store listens with the agent store: the address --master_addr
// names (an IP address as given; a host name: the first of its addresses that is this
// host's), else loopback (the default 127.0.0.1, localhost, a name not of this host).
std::string single_node_store_address(const std::string& master_addr);

class WorkerStore {
 public:
  // `agent_store`: serve the workers (else the old way: rank 0 hosts its own store).
  // `job_store`: the job's store this ddprun hosts, or null; it must outlive this.
  // `verbose`: say where a torch-only store listens (-v).
  WorkerStore(bool agent_store, StoreHost* job_store, bool verbose = false)
      : agent_store_(agent_store), job_store_(job_store), verbose_(verbose) {}

  bool agent_store() const { return agent_store_; }

  // The port this node gives as MASTER_PORT when its node is the attempt's group rank 0:
  // the job store's, else a torch-only store's, started here on `address` (this node's
  // address in the job) the first time; without the agent store, a free port.
  // Throws LaunchError when the torch-only store cannot listen.
  int offer_port(const std::string& address);

  // Before `attempt`'s workers start: torch clients of every store this node serves
  // go to `agent_ns` + "/torch/attempt_<attempt>".
  void serve_attempt(const std::string& agent_ns, int attempt);

  // The namespace serve_attempt gives torch clients.
  static std::string torch_namespace(const std::string& agent_ns, int attempt);

 private:
  bool agent_store_;
  StoreHost* job_store_;
  bool verbose_;
  std::unique_ptr<StoreHost> torch_only_;
};

}  // namespace ddprun
