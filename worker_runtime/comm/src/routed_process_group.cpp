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
      : ProcessGroup(host->rank(), host->size()), host_(std::move(host)), gpu_(std::move(gpu)) {
    if (gpu_->rank() != rank() || gpu_->size() != size()) {
      throw InvalidArgument("routed group: the host and GPU groups disagree on rank or size");
    }
  }

  std::string backend() const override { return host_->backend() + "+" + gpu_->backend(); }

  Work all_reduce(Buffer buf, ReduceOp op, CollectiveOptions o) override {
    return pick(buf, "all_reduce").all_reduce(buf, op, o);
  }
  Work broadcast(Buffer buf, int root, CollectiveOptions o) override {
    return pick(buf, "broadcast").broadcast(buf, root, o);
  }
  Work reduce(Buffer buf, int root, ReduceOp op, CollectiveOptions o) override {
    return pick(buf, "reduce").reduce(buf, root, op, o);
  }
  Work all_gather(Buffer input, Buffer output, CollectiveOptions o) override {
    return pick(input, output, "all_gather").all_gather(input, output, o);
  }
  Work gather(Buffer input, Buffer output, int root, CollectiveOptions o) override {
    return pick(input, output, "gather").gather(input, output, root, o);
  }
  Work scatter(Buffer input, Buffer output, int root, CollectiveOptions o) override {
    return pick(input, output, "scatter").scatter(input, output, root, o);
  }
  Work reduce_scatter(Buffer input, Buffer output, ReduceOp op, CollectiveOptions o) override {
    return pick(input, output, "reduce_scatter").reduce_scatter(input, output, op, o);
  }
  Work all_to_all(Buffer input, Buffer output, CollectiveOptions o) override {
    return pick(input, output, "all_to_all").all_to_all(input, output, o);
  }
  // Entering the barrier is what every rank must have done; the host group is the
  // cheaper place to meet (a device-side barrier would also wait for queued GPU work,
  // which Work::wait on those operations already does).
  Work barrier(CollectiveOptions o) override { return host_->barrier(o); }
  Work send(Buffer buf, int dst, CollectiveOptions o) override { return pick(buf, "send").send(buf, dst, o); }
  Work recv(Buffer buf, int src, CollectiveOptions o) override { return pick(buf, "recv").recv(buf, src, o); }

  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    // Both members take part, in the same order on every rank.
    auto host = host_->new_group(ranks);
    auto gpu = gpu_->new_group(ranks);
    if (!host != !gpu) throw Error("routed group: new_group: the host and GPU groups disagree on membership");
    if (!host) return nullptr;
    return std::make_shared<RoutedProcessGroup>(std::move(host), std::move(gpu));
  }

  // Group memory is host memory: the host group's, shared between a host's ranks.
  std::unique_ptr<GroupMemory> allocate(size_t bytes) override { return host_->allocate(bytes); }

  void abort(const std::string& reason) override {
    host_->abort(reason);
    gpu_->abort(reason);
  }

 private:
  ProcessGroup& pick(const Buffer& b, const char*) { return b.device == Device::Cuda ? *gpu_ : *host_; }
  // Two buffers must live on the same side. An empty one (the non-root side of
  // gather and scatter may pass Buffer{}) does not decide.
  ProcessGroup& pick(const Buffer& in, const Buffer& out, const char* what) {
    if (in.count == 0) return pick(out, what);
    if (out.count == 0) return pick(in, what);
    if (in.device != out.device) {
      throw InvalidArgument(std::string(what) + ": input and output must both be host memory or both GPU memory");
    }
    return pick(in, what);
  }

  std::shared_ptr<ProcessGroup> host_;
  std::shared_ptr<ProcessGroup> gpu_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_routed_group(std::shared_ptr<ProcessGroup> host, std::shared_ptr<ProcessGroup> gpu) {
  return std::make_shared<RoutedProcessGroup>(std::move(host), std::move(gpu));
}

}  // namespace ddp::detail
