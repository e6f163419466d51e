// The group init() builds for backend "auto" on a GPU host: two groups over the same
// ranks, one for host memory (the cpu backend) and one for GPU memory (nccl), and
// each collective goes to the one that can reach its buffers. This is what PyTorch's
// default "cpu:gloo,cuda:nccl" does; without it a program that keeps its gradients
// in host memory (the CPU examples, DDP on the CPU) would fail on any machine with
// a GPU, since NCCL refuses host buffers.
//
// The two members are independent groups: operations on host buffers are ordered
// with each other, and so are operations on GPU buffers, but not one kind with the
// other (as with two torch.distributed backends).
#include "backend.hpp"

namespace ddp::detail {
namespace {

class RoutedProcessGroup final : public ProcessGroup {
 public:
  RoutedProcessGroup(std::shared_ptr<ProcessGroup> host, std::shared_ptr<ProcessGroup> gpu)
      : ProcessGroup(host->rank(), host->size(), Reach::HostAndGpu), host_(std::move(host)), gpu_(std::move(gpu)) {
    if (gpu_->rank() != rank() || gpu_->size() != size()) {
      throw InvalidArgument("routed group: the host and GPU groups disagree on rank or size");
    }
    // Calls are recorded once, here; the members mark this group's entries.
    leave_recording_to_outer(*host_);
    leave_recording_to_outer(*gpu_);
  }

  std::string backend() const override { return host_->backend() + "+" + gpu_->backend(); }

  void abort(const std::string& reason) override {
    host_->abort(reason);
    gpu_->abort(reason);
  }

 protected:
  // The call was checked here already (input and output on one side): the member
  // runs it as is.
  Work run(const Op& op) override { return run_on(member_for(op), op); }

  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& ranks) override {
    // Both members take part, in the same order on every rank.
    auto host = make_subgroup_on(*host_, ranks);
    auto gpu = make_subgroup_on(*gpu_, ranks);
    if (!host != !gpu) throw Error("routed group: new_group: the host and GPU groups disagree on membership");
    if (!host) return nullptr;
    return std::make_shared<RoutedProcessGroup>(std::move(host), std::move(gpu));
  }

  // Group memory is host memory: the host group's, shared between a host's ranks.
  std::unique_ptr<GroupMemory> allocate_memory(size_t bytes) override { return allocate_memory_on(*host_, bytes); }

 private:
  ProcessGroup& member_for(const Op& op) {
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

  std::shared_ptr<ProcessGroup> host_;
  std::shared_ptr<ProcessGroup> gpu_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_routed_group(std::shared_ptr<ProcessGroup> host, std::shared_ptr<ProcessGroup> gpu) {
  return std::make_shared<RoutedProcessGroup>(std::move(host), std::move(gpu));
}

}  // namespace ddp::detail
