// The backend init() builds for "auto" on a GPU host: two backends over the same
// ranks, one for host memory (cpu) and one for GPU memory (nccl), and each collective
// goes to the one that can reach its buffers. This is what PyTorch's default
// "cpu:gloo,cuda:nccl" does; without it a program that keeps its gradients in host
// memory (the CPU examples, DDP on the CPU) would fail on any machine with a GPU,
// since NCCL refuses host buffers.
//
// The two members are independent: operations on host buffers are ordered with each
// other, and so are operations on GPU buffers, but not one kind with the other (as
// with two torch.distributed backends).
#include "group_setup.hpp"

namespace ddp::detail {
namespace {

class RoutedBackend final : public Backend {
 public:
  RoutedBackend(std::unique_ptr<Backend> host, std::unique_ptr<Backend> gpu)
      : Backend(host->rank(), host->size(), Reach::HostAndGpu), host_(std::move(host)), gpu_(std::move(gpu)) {
    if (gpu_->rank() != rank() || gpu_->size() != size()) {
      throw InvalidArgument("routed group: the host and GPU groups disagree on rank or size");
    }
  }

  std::string kind() const override { return host_->kind() + "+" + gpu_->kind(); }

  void set_group_name(const std::string& name) override {
    Backend::set_group_name(name);
    host_->set_group_name(name);
    gpu_->set_group_name(name);
  }

  void abort(const std::string& reason) override {
    host_->abort(reason);
    gpu_->abort(reason);
  }

  // The call was checked already (input and output on one side): the member runs it
  // as is, and marks its entry in the group's flight recorder through its Work.
  Work run(const Op& op) override { return member_for(op).run(op); }

  std::unique_ptr<Backend> make_subgroup(const std::vector<int>& ranks) override {
    // Both members take part, in the same order on every rank.
    auto host = host_->make_subgroup(ranks);
    auto gpu = gpu_->make_subgroup(ranks);
    if (!host != !gpu) throw Error("routed group: new_group: the host and GPU groups disagree on membership");
    if (!host) return nullptr;
    return std::make_unique<RoutedBackend>(std::move(host), std::move(gpu));
  }

  // Group memory is host memory: the host group's, shared between a host's ranks.
  std::unique_ptr<GroupMemory> allocate_memory(size_t bytes) override { return host_->allocate_memory(bytes); }

 private:
  Backend& member_for(const Op& op) {
    // Entering the barrier is what every rank must have done; the host group is the
    // cheaper place to meet (a device-side barrier would also wait for queued GPU
    // work, which Work::wait on those operations already does).
    if (op.kind == OpKind::Barrier) return *host_;
    // The buffer this rank uses decides: a non-root never touches the other side of
    // gather (its output) or scatter (its input), whatever it passes there; elsewhere
    // an empty input does not decide.
    const bool non_root = op.peer >= 0 && op.peer != rank();
    Buffer used = op.input.count == 0 ? op.output : op.input;
    if (non_root && op.kind == OpKind::Gather) used = op.input;
    if (non_root && op.kind == OpKind::Scatter) used = op.output;
    return used.device == Device::Cuda ? *gpu_ : *host_;
  }

  std::unique_ptr<Backend> host_;
  std::unique_ptr<Backend> gpu_;
};

}  // namespace

std::unique_ptr<Backend> make_routed_backend(std::unique_ptr<Backend> host, std::unique_ptr<Backend> gpu) {
  return std::make_unique<RoutedBackend>(std::move(host), std::move(gpu));
}

}  // namespace ddp::detail
