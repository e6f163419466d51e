// hello_ranks: the smallest ddprun worker. Each rank reads its place in the job
// from the launch environment and reports it; rank 0 also says how to reach it.
//
//   ddprun --nproc_per_node=4 build/examples/hello_ranks/hello_ranks
#include <unistd.h>

#include <cstdio>

#include "ddp/contract/worker_env.hpp"

int main() {
  ddp::contract::WorkerEnv env;
  try {
    env = ddp::contract::WorkerEnv::from_environment();
  } catch (const ddp::contract::ContractError& e) {
    std::fprintf(stderr, "hello_ranks: %s\n", e.what());
    return 2;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::printf("rank %d of %d (local rank %d of %d, node %d of %d) on %s, pid %d\n", env.rank, env.world_size,
              env.local_rank, env.local_world_size, env.group_rank, env.group_world_size, host, getpid());
  if (env.rank == 0) {
    std::printf("rank 0 may host a store at %s:%d for run %s (attempt %d)\n", env.master_addr.c_str(),
                env.master_port, env.run_id.c_str(), env.restart_count);
  }
  return 0;
}
