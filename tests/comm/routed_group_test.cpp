// The group backend "auto" builds on a GPU host (src/routed_process_group.cpp): each
// collective reaches the member that can touch its buffers. The members here are
// recording stand-ins, since the GPU side (NCCL) cannot run without a GPU; the CPU
// backend itself is tested for real by the collectives suites.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "backend.hpp"

namespace {

using ddp::Buffer;
using ddp::Device;

// Records the name of every operation it is asked to run.
class RecordingGroup final : public ddp::ProcessGroup {
 public:
  RecordingGroup(std::string name, int rank = 1, int size = 4, ddp::Reach reach = ddp::Reach::HostAndGpu)
      : ProcessGroup(rank, size, reach), name_(std::move(name)) {}
  std::vector<std::string> calls;

  std::string backend() const override { return name_; }
  void abort(const std::string&) override { note("abort"); }

 protected:
  ddp::Work run(const ddp::Op& op) override { return note(ddp::op_kind_name(op.kind)); }
  std::shared_ptr<ddp::ProcessGroup> make_subgroup(const std::vector<int>& ranks) override {
    note("new_group");
    bool member = false;
    for (int r : ranks) member |= r == rank();
    return member ? std::make_shared<RecordingGroup>(name_ + "-sub", 0, static_cast<int>(ranks.size())) : nullptr;
  }
  std::unique_ptr<ddp::GroupMemory> allocate_memory(size_t bytes) override {
    note("allocate");
    return ProcessGroup::allocate_memory(bytes);
  }

 private:
  ddp::Work note(const std::string& what) {
    calls.push_back(what);
    return {};
  }
  std::string name_;
};

float host_data[8];

Buffer host(size_t n = 8) { return Buffer{host_data, n, ddp::DType::F32, Device::Cpu}; }
// Never dereferenced: the recording members only look at the call.
Buffer gpu(size_t n = 8) { return Buffer{reinterpret_cast<void*>(0x1000), n, ddp::DType::F32, Device::Cuda}; }

}  // namespace

TEST_CASE("routed group: host buffers go to the host backend, GPU buffers to the GPU one", "[routed]") {
  auto cpu = std::make_shared<RecordingGroup>("cpu");
  auto nccl = std::make_shared<RecordingGroup>("nccl");
  auto pg = ddp::detail::make_routed_group(cpu, nccl);
  CHECK(pg->backend() == "cpu+nccl");
  CHECK(pg->rank() == 1);
  CHECK(pg->size() == 4);

  pg->all_reduce(gpu());
  pg->broadcast(host(), 0);
  pg->reduce(gpu(), 0);
  pg->all_gather(host(2), host(8));
  pg->gather(gpu(2), Buffer{}, 0);  // a non-root gather may pass an empty output
  pg->scatter(Buffer{}, host(2), 0);
  pg->reduce_scatter(gpu(8), gpu(2));
  pg->all_to_all(host(), host());
  pg->send(gpu(), 2);
  pg->recv(host(), 0);
  pg->barrier();
  CHECK(nccl->calls == std::vector<std::string>{"all_reduce", "reduce", "gather", "reduce_scatter", "send"});
  CHECK(cpu->calls ==
        std::vector<std::string>{"broadcast", "all_gather", "scatter", "all_to_all", "recv", "barrier"});
}

TEST_CASE("routed group: a non-root gather or scatter goes where the buffer it uses is", "[routed]") {
  auto cpu = std::make_shared<RecordingGroup>("cpu");  // this is rank 1; the root is 0
  auto nccl = std::make_shared<RecordingGroup>("nccl");
  auto pg = ddp::detail::make_routed_group(cpu, nccl);
  pg->scatter(host(8), gpu(2), 0);  // the input is the root's side: never read here
  pg->gather(gpu(2), host(8), 0);   // the output is the root's side: never written here
  pg->scatter(gpu(8), host(2), 0);
  pg->gather(host(2), gpu(8), 0);
  CHECK(nccl->calls == std::vector<std::string>{"scatter", "gather"});
  CHECK(cpu->calls == std::vector<std::string>{"scatter", "gather"});
}

TEST_CASE("routed group: mixed host and GPU buffers in one call are refused", "[routed]") {
  auto cpu = std::make_shared<RecordingGroup>("cpu");
  auto nccl = std::make_shared<RecordingGroup>("nccl");
  auto pg = ddp::detail::make_routed_group(cpu, nccl);
  CHECK_THROWS_AS(pg->all_gather(host(2), gpu(8)), ddp::InvalidArgument);
  CHECK_THROWS_AS(pg->all_to_all(gpu(), host()), ddp::InvalidArgument);
  CHECK(cpu->calls.empty());
  CHECK(nccl->calls.empty());
}

TEST_CASE("routed group: memory, subgroups and abort involve the right members", "[routed]") {
  auto cpu = std::make_shared<RecordingGroup>("cpu");
  auto nccl = std::make_shared<RecordingGroup>("nccl");
  auto pg = ddp::detail::make_routed_group(cpu, nccl);
  auto memory = pg->allocate(64);
  REQUIRE(memory);
  CHECK(memory->bytes() == 64);
  CHECK(cpu->calls == std::vector<std::string>{"allocate"});
  CHECK(nccl->calls.empty());

  auto sub = pg->new_group({3, 1});
  REQUIRE(sub);
  CHECK(sub->backend() == "cpu-sub+nccl-sub");
  CHECK(pg->new_group({0, 2}) == nullptr);  // not a member: both members still took part
  CHECK(cpu->calls == std::vector<std::string>{"allocate", "new_group", "new_group"});
  CHECK(nccl->calls == std::vector<std::string>{"new_group", "new_group"});

  pg->abort("test");
  CHECK(cpu->calls.back() == "abort");
  CHECK(nccl->calls.back() == "abort");
}

TEST_CASE("routed group: members that disagree on rank or size are refused", "[routed]") {
  auto cpu = std::make_shared<RecordingGroup>("cpu", 1, 4);
  auto nccl = std::make_shared<RecordingGroup>("nccl", 1, 3);
  CHECK_THROWS_AS(ddp::detail::make_routed_group(cpu, nccl), ddp::InvalidArgument);
}
