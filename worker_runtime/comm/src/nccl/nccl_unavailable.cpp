// The NCCL backend's entry points in a build without CUDA or NCCL: init() then falls
// back to the CPU backend for "auto" and reports a clear error for "nccl".
#include "group_setup.hpp"

namespace ddp::detail {

std::unique_ptr<Backend> make_nccl_backend(const GroupSetup&) {
  throw Error("the nccl backend is not available: ddprun was built without NCCL (CUDA Toolkit or NCCL not found)");
}

bool nccl_usable(int) { return false; }

std::string exchange_nccl_unique_id(rdzv::Store&, const std::string&, int, Millis, const GroupPeers&) {
  throw Error("cannot create an NCCL unique id: ddprun was built without NCCL");
}

}  // namespace ddp::detail
