// The environment a worker starts with: ddprun's own environment plus the worker's
// launch contract (contract::WorkerEnv), made from the launch plan and the attempt's
// layout.
#pragma once

#include <string>
#include <vector>

#include "ddp/contract/worker_env.hpp"
#include "job/job_layout.hpp"
#include "plan/launch_plan.hpp"

namespace ddprun {

// The launch contract of one worker (contract::WorkerEnv); `error_file` becomes its
// TORCHELASTIC_ERROR_FILE (none when empty).
contract::WorkerEnv worker_contract(const LaunchPlan& plan, const JobLayout& layout, int local_rank,
                                    const std::string& error_file = {});

// The environment of one worker: ddprun's own environment plus its launch contract.
std::vector<std::string> worker_environment(const LaunchPlan& plan, const JobLayout& layout, int local_rank,
                                            const std::string& error_file = {});

}  // namespace ddprun
