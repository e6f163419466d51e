// What a launch asks of its job, compared across the launches that share a job id:
// the node count (--nnodes N, or MIN:MAX) and, in a fixed job, each node rank's worker
// count. Nodes of one job agree on both (a node's workers may differ from another
// node's, never from its own rank's earlier claim); a launch that does not is an
// unrelated job reusing a running job's --rdzv_id on a daemon (or a node started with
// the wrong --nnodes), and is refused before it registers anything.
#pragma once

#include <string>

#include "plan/launch_plan.hpp"
#include "rdzv/store.hpp"

namespace ddprun {

// The first launch of a job records its shape (JobKeys::shape, and in a fixed job its
// node rank's worker count and this launch's identity, JobKeys::node_shape); a later
// one compares with them. Throws UsageError naming both shapes when they differ
// ("rendezvous: job 'x' is already running with 2 nodes × 4 processes; this launch asks
// for 3 nodes × 2 processes"), or shared_job_id_message() when another launch claimed
// this node rank; rdzv::StoreError when the store fails. `where`: the store's HOST:PORT.
void check_job_shape(rdzv::Store& store, const std::string& job, const LaunchPlan& plan, const std::string& where);

// "rendezvous: another job uses --rdzv_id <job> at <where>; give each job its own --rdzv_id".
std::string shared_job_id_message(const std::string& job, const std::string& where);

}  // namespace ddprun
