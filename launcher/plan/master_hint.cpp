#include "plan/master_hint.hpp"

namespace ddprun {

std::optional<std::string> unused_master_addr_hint(const LaunchOptions& o, const char* env_master_addr) {
  if (o.nnodes < 2 || o.master_addr_given || o.rdzv_host || o.remote.launching()) return std::nullopt;
  if (env_master_addr == nullptr || *env_master_addr == '\0' || o.master_addr == env_master_addr) return std::nullopt;
  return "a " + std::to_string(o.nnodes) + "-node job without --master_addr looks for node 0's store at " +
         o.master_addr + ", the default, though the environment has MASTER_ADDR=" + env_master_addr +
         " (as a Kubeflow PyTorchJob pod does): ddprun, like torchrun, reads only --master_addr and "
         "PET_MASTER_ADDR; pass --master_addr=$(MASTER_ADDR) --master_port=$(MASTER_PORT)";
}

}  // namespace ddprun
