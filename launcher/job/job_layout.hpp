// What one attempt of the job looks like from this node, once every node joined: the
// membership's answer to a join (membership.hpp), from which each worker's launch
// contract is made (supervise/worker_environment.hpp).
#pragma once

#include <string>

#include "ddp/contract/worker_env.hpp"

namespace ddprun {

namespace contract = ddp::contract;

struct JobLayout {
  int attempt = 0;                // the attempt joined (an elastic node may join a later one than asked)
  int node_rank = 0;              // GROUP_RANK: this node's place among the attempt's nodes
  int nnodes = 1;                 // GROUP_WORLD_SIZE: the attempt's nodes
  int restart_count = 0;          // TORCHELASTIC_RESTART_COUNT: failures the job restarted after
  int world_size = 1;             // workers in the job
  int rank_offset = 0;            // global rank of this node's local rank 0
  std::string master_addr;        // MASTER_ADDR / MASTER_PORT: where rank 0 may host a store
  int master_port = 0;
  contract::StoreEndpoint store;  // DDPRUN_STORE_*: the job's store and this attempt's groups prefix
};

}  // namespace ddprun
