// The worker environment: how a launcher tells a worker process its place in the job.
//
// ddprun writes it (to_env) and the worker runtime reads it (from_environment); this
// struct is the one definition of every variable both sides use. It speaks
// torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_*,
// ROLE_*, MASTER_ADDR/PORT, TORCHELASTIC_*), so unmodified PyTorch programs run under
// ddprun, plus ddprun's own DDPRUN_* (the job's store). It also reads what srun and
// mpirun set, for programs started by those without a launcher.
//
// CommSettings are the DDP_* knobs of the worker runtime, read here too.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "ddp/contract/parse.hpp"

namespace ddp::contract {

// Who started this process.
enum class Launcher {
  Ddprun,    // DDPRUN_STORE_ADDR set: the job's store is the launcher's
  Torchrun,  // RANK/WORLD_SIZE/MASTER_* without DDPRUN_*: torchrun, or by hand
  Slurm,     // SLURM_PROCID without RANK: srun with one task per GPU
  Mpirun,    // OMPI_COMM_WORLD_RANK without RANK: Open MPI's mpirun
};
const char* launcher_name(Launcher launcher);  // "ddprun", "torchrun", "slurm", "mpirun"

// Where a worker started by ddprun finds the job's store (DDPRUN_STORE_*).
struct StoreEndpoint {
  std::string addr;    // DDPRUN_STORE_ADDR
  int port = 0;        // DDPRUN_STORE_PORT
  std::string token;   // DDPRUN_STORE_TOKEN: proves membership of the job
  std::string ns;      // DDPRUN_STORE_NAMESPACE: the job's namespace on a shared daemon
  std::string prefix;  // DDPRUN_STORE_PREFIX: the process groups' keys (JobKeys::process_groups)
  // DDPRUN_STORE_ATTEMPT: the attempt whose keys (JobKeys(attempt): exit records,
  // progress) this worker reads and writes. Not TORCHELASTIC_RESTART_COUNT: an elastic
  // job re-formed for a joining node starts a new attempt with the same restart count.
  // -1 when absent (an older launcher): the restart count stands in.
  int attempt = -1;
};

struct WorkerEnv {
  Launcher launcher = Launcher::Torchrun;
  int rank = 0;               // global rank, 0 .. world_size-1 (RANK)
  int world_size = 1;         // workers in the job (WORLD_SIZE)
  int local_rank = 0;         // rank on this node (LOCAL_RANK)
  int local_world_size = 1;   // workers on this node (LOCAL_WORLD_SIZE)
  int group_rank = 0;         // this node's index (GROUP_RANK; DDPRUN_NODE_RANK)
  int group_world_size = 1;   // nodes in the job (GROUP_WORLD_SIZE)
  std::string role_name = "default";  // ROLE_NAME (ROLE_RANK/ROLE_WORLD_SIZE mirror rank/world_size)
  std::string master_addr;    // MASTER_ADDR: where rank 0 can host a store
  int master_port = 0;        // MASTER_PORT: a port rank 0 can bind
  std::string run_id;         // TORCHELASTIC_RUN_ID (and DDPRUN_RUN_ID)
  int restart_count = 0;      // TORCHELASTIC_RESTART_COUNT: 0 on the first attempt
  int max_restarts = 0;       // TORCHELASTIC_MAX_RESTARTS
  // TORCHELASTIC_USE_AGENT_STORE=True: the launcher's agent already serves a store on
  // MASTER_PORT (torchrun 2.x, and ddprun unless --no_agent_store; ddprun's own runtime
  // still uses DDPRUN_STORE_*).
  bool use_agent_store = false;
  std::optional<StoreEndpoint> store;  // ddprun's job store (Launcher::Ddprun only)
  // DDPRUN_TOKEN, when there is no ddprun store: the shared token the store rank 0
  // hosts requires (every rank presents it); empty: that store admits anyone. (ddprun
  // and ddp-rendezvous read the same variable for their own stores.)
  std::string token;
  // TORCHELASTIC_ERROR_FILE: where PyTorch's @record writes the exception that ended
  // the worker (JSON), for the launcher's failure summary; empty: not set.
  std::string error_file;
  // TORCH_NCCL_ASYNC_ERROR_HANDLING, as torchrun sets it: the launcher's own value when
  // it has one, else "1" (a failed NCCL collective aborts the communicator and the
  // process, instead of hanging).
  std::string nccl_async_error_handling = "1";
  // TORCHELASTIC_SIGNALS_TO_HANDLE: the signals the launcher forwards to its workers.
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // CUDA_VISIBLE_DEVICES (and HIP_VISIBLE_DEVICES when hip_visible_device) as torchrun's
  // --virtual_local_rank sets them: the one GPU this worker sees; empty: inherited.
  std::string visible_device;
  bool hip_visible_device = false;
  // OMP_NUM_THREADS=1, which ddprun sets for several workers when the user did not.
  bool single_omp_thread = false;
  // The rule for single_omp_thread, as torchrun has it: more than one worker on the
  // node and no OMP_NUM_THREADS in the launcher's own environment.
  static bool wants_single_omp_thread(const Variables& launcher_env, int local_world_size);

  // Where init() has rank 0 host its store when no launcher store is given:
  // MASTER_PORT, except under torchrun's agent, whose store already listens there;
  // then a port every rank derives alike from MASTER_PORT, the run id and the restart
  // count (20000-32767, below the ephemeral ports).
  int store_port() const;

  // The variables this describes, name -> value, as ddprun hands them to a worker.
  std::map<std::string, std::string> to_env() const;

  // Reads this process's environment (see from_variables).
  static WorkerEnv from_environment();
  // Under ddprun or torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are
  // required; the others default to a single-node job (LOCAL_* mirror the globals).
  // Under srun (SLURM_PROCID set, RANK not): ranks from SLURM_PROCID/NTASKS/LOCALID/
  // TASKS_PER_NODE, the node from SLURM_NODEID/NNODES, MASTER_ADDR (unless set) is
  // the step's first host and MASTER_PORT (unless set) derived from the job and step.
  // Under mpirun (OMPI_COMM_WORLD_RANK set, RANK not): ranks from OMPI_COMM_WORLD_*,
  // MASTER_ADDR defaults to 127.0.0.1 when all ranks share a host, MASTER_PORT is
  // derived from the Open MPI job id.
  // Throws ContractError naming the first variable that is missing or invalid, or
  // when values contradict each other (RANK >= WORLD_SIZE).
  static WorkerEnv from_variables(const Variables& vars);
};

// How often a wait says what it still waits for when DDP_WAIT_NOTICE_SEC is not set.
inline constexpr Millis kDefaultWaitNotice{30000};

// DDP_WAIT_NOTICE_SEC (decimal seconds): how often a rank or a node that waits (for the
// store, its peers, other nodes) says whom it waits for; else kDefaultWaitNotice.
// Throws ContractError when it is malformed.
Millis wait_notice_every(const Variables& vars);

// The worker runtime's knobs (DDP_* variables), all read here.
struct CommSettings {
  std::optional<Millis> timeout;        // DDP_TIMEOUT_SEC: every collective's limit, and forming a group's
  // DDP_WAIT_NOTICE_SEC: how often a rank waiting for the store or for its peers
  // to join says so on stderr.
  Millis wait_notice_every = kDefaultWaitNotice;
  std::optional<std::string> backend;   // DDP_BACKEND: cpu, nccl or auto
  bool disable_shm = false;             // DDP_DISABLE_SHM=1: every rank its own host (TCP only)
  bool disable_cma = false;             // DDP_DISABLE_CMA=1: no cross-process memory access
  long spin_us = -1;                    // DDP_SPIN_US: busy-wait before sleeping (-1: choose)
  size_t shm_ring_bytes = 0;            // DDP_SHM_RING_BYTES: each shared-memory ring (0: choose)
  // DDP_SOCKET_IFNAME: the interfaces the TCP mesh may use, in Gloo's and NCCL's syntax
  // (eth0,ib / ^docker / =eth1); nothing: every interface, advertising the address
  // that reaches the store. Its syntax is checked where it is used (cpu/interfaces.hpp).
  std::optional<std::string> socket_ifname;
  // Where the CPU all-reduce and broadcast switch algorithms (bytes).
  size_t small_allreduce_bytes = 32 * 1024;     // DDP_SMALL_ALLREDUCE_BYTES
  size_t small_broadcast_bytes = 64 * 1024;     // DDP_SMALL_BROADCAST_BYTES
  size_t direct_allreduce_bytes = 32 * 1024;    // DDP_DIRECT_ALLREDUCE_BYTES
  size_t staged_allreduce_bytes = 1024 * 1024;  // DDP_STAGED_ALLREDUCE_BYTES
  // DDP_FLIGHT_RECORDER: how many of its last collectives each process group keeps
  // in its flight recorder (0: none are kept).
  size_t flight_recorder_entries = 2000;

  static CommSettings from_environment();
  // Throws ContractError naming a malformed variable.
  static CommSettings from_variables(const Variables& vars);
};

}  // namespace ddp::contract
