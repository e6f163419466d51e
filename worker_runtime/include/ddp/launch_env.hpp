// The launch environment a worker process receives from its launcher.
//
// ddprun (like torchrun) describes each worker's place in the job through
// environment variables: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, MASTER_ADDR, MASTER_PORT and
// TORCHELASTIC_*. LaunchEnv reads and validates them in one place so a
// training program never parses getenv() by hand.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

// Thrown when a variable of the launch contract is missing or malformed.
// what() names the variable and the value that was found.
class LaunchEnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LaunchEnv {
  int rank = 0;               // global rank, 0 .. world_size-1 (RANK)
  int world_size = 1;         // number of workers in the job (WORLD_SIZE)
  int local_rank = 0;         // rank on this node, 0 .. local_world_size-1 (LOCAL_RANK)
  int local_world_size = 1;   // workers on this node (LOCAL_WORLD_SIZE)
  int group_rank = 0;         // this node's index, 0 .. group_world_size-1 (GROUP_RANK)
  int group_world_size = 1;   // number of nodes (GROUP_WORLD_SIZE)
  std::string role_name;      // ROLE_NAME, "default" unless --role was given
  std::string master_addr;    // MASTER_ADDR: where rank 0 can host a store
  int master_port = 0;        // MASTER_PORT: a port rank 0 can bind
  // Where ddp::init() has rank 0 host its store when no launcher store is given:
  // MASTER_PORT, except under torchrun's agent (TORCHELASTIC_USE_AGENT_STORE=True),
  // whose own store already listens there; then a port every rank derives alike
  // from MASTER_PORT, the run id and the restart count (20000-39999).
  int store_port = 0;
  std::string run_id;         // TORCHELASTIC_RUN_ID
  int restart_count = 0;      // TORCHELASTIC_RESTART_COUNT: 0 on the first attempt
  std::string launcher;       // "torchrun" (ddprun or torchrun set RANK...), "slurm" or "mpirun"

  // Reads the variables above from this process's environment.
  // Under ddprun or torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are
  // required; the others default to a single-node job (LOCAL_* mirror the globals).
  // Under srun with one task per GPU and no launcher (SLURM_PROCID set, RANK not):
  // RANK/WORLD_SIZE/LOCAL_* come from SLURM_PROCID/NTASKS/LOCALID/TASKS_PER_NODE,
  // the node from SLURM_NODEID/NNODES, MASTER_ADDR (unless set) is the step's first
  // host and MASTER_PORT (unless set) is derived from the job id.
  // Under mpirun (OMPI_COMM_WORLD_RANK set, RANK not): ranks from OMPI_COMM_WORLD_*,
  // MASTER_ADDR defaults to 127.0.0.1 when all ranks share one host, MASTER_PORT
  // is derived from the Open MPI job id.
  // Throws LaunchEnvError naming the first variable that is missing or invalid,
  // or when the values contradict each other (e.g. RANK >= WORLD_SIZE).
  static LaunchEnv from_environment();
};

}  // namespace ddp
