// A worker's environment (worker_environment.hpp).
#include "supervise/worker_environment.hpp"

#include <cstdlib>
#include <map>
#include <string_view>

extern char** environ;

namespace ddprun {

contract::WorkerEnv worker_contract(const LaunchPlan& plan, const JobLayout& layout, int local_rank,
                                    const std::string& error_file) {
  const LaunchOptions& o = plan.options;
  contract::WorkerEnv w;
  w.launcher = contract::Launcher::Ddprun;
  w.rank = layout.rank_offset + local_rank;
  w.world_size = layout.world_size;
  w.local_rank = o.virtual_local_rank ? 0 : local_rank;  // each worker's one GPU is its device 0
  if (o.virtual_local_rank) {
    w.visible_device = plan.visible_devices[local_rank];
    w.hip_visible_device = plan.hip_visible_devices;
  }
  w.signals_to_handle = o.signals_to_handle;
  w.local_world_size = plan.nproc;
  w.group_rank = layout.node_rank;
  w.group_world_size = layout.nnodes;
  w.role_name = o.role;
  w.master_addr = layout.master_addr;
  w.master_port = layout.master_port;
  w.run_id = plan.run_id;
  w.restart_count = layout.restart_count;
  w.max_restarts = o.max_restarts;
  // True: MASTER_ADDR:MASTER_PORT is a store ddprun serves (store/worker_store.hpp).
  w.use_agent_store = o.agent_store;
  w.store = layout.store;
  w.single_omp_thread = plan.set_omp_num_threads;
  w.error_file = error_file;
  // As torchrun: the user's own setting wins.
  if (const char* v = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"); v != nullptr && *v != '\0') {
    w.nccl_async_error_handling = v;
  }
  return w;
}

std::vector<std::string> worker_environment(const LaunchPlan& plan, const JobLayout& layout, int local_rank,
                                            const std::string& error_file) {
  const std::map<std::string, std::string> vars = worker_contract(plan, layout, local_rank, error_file).to_env();
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string_view::npos && vars.count(std::string(entry.substr(0, eq))) != 0) continue;
    env.emplace_back(entry);
  }
  for (const auto& [key, value] : vars) env.push_back(key + "=" + value);
  return env;
}

}  // namespace ddprun
