// Joining the job: one call builds the process group from the environment.
//
//   auto pg = ddp::init();                     // under ddprun, torchrun, srun or mpirun
//   pg->all_reduce(ddp::view(grads), ddp::ReduceOp::Avg);
//
// Where the group finds its peers, in order of preference:
//  1. ddprun: DDPRUN_STORE_ADDR/PORT/TOKEN/NAMESPACE/PREFIX point at the launcher's
//     store (the key prefix is per attempt, so a restarted attempt starts clean).
//  2. torchrun-style: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; rank 0 hosts a store
//     on MASTER_PORT, or under torchrun itself (whose agent already serves its own
//     store there: TORCHELASTIC_USE_AGENT_STORE=True) on a port every rank derives
//     from MASTER_PORT, the run id and the restart count (contract::WorkerEnv::store_port).
//  3. srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (see contract::WorkerEnv).
//  4. mpirun: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; MASTER_ADDR (default
//     127.0.0.1 when every rank is on one host) and MASTER_PORT (default: derived from
//     the Open MPI job id).
// Ranks on other hosts connect to this one's TCP listener at the address it reaches
// the store from, or on the interface DDP_SOCKET_IFNAME names (Gloo's and NCCL's
// syntax: eth / =eth1 / ^docker; see cpu/interfaces.hpp), whose IPv4 address it then
// binds; a value that matches no interface makes init() throw Error naming it.
#pragma once

#include <memory>
#include <string>

#include "ddp/contract/worker_env.hpp"
#include "ddp/process_group.hpp"

namespace ddp {

struct InitOptions {
  // "cpu" (shared memory within a host, TCP across hosts), "nccl" (GPU buffers only),
  // or "auto": cpu, and when NCCL was built and a GPU is visible also nccl, each
  // collective going to the one that reaches its buffers (host or Device::Cuda), as
  // PyTorch's default "cpu:gloo,cuda:nccl"; backend() then says "cpu+nccl".
  std::string backend = "auto";
  // Limit of every collective (a live but stuck peer); DDP_TIMEOUT_SEC overrides.
  Millis timeout{600000};
  // Limit of finding the store and every peer at start.
  Millis connect_timeout{300000};
};

// Builds the default process group from the environment (see above). Throws
// contract::ContractError naming what is missing, Error when peers cannot be reached.
std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});

}  // namespace ddp
