// The backend "auto" builds on a GPU host (src/routed_backend.cpp): each collective
// reaches the member that can touch its buffers. The members here are recording
// stand-ins, since the GPU side (NCCL) cannot run without a GPU; the CPU backend
// itself is tested for real by the collectives suites.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "group_setup.hpp"
#include "recording_backend.hpp"

namespace {

using ddp::Buffer;
using ddp::Device;
using Calls = std::vector<std::string>;

// A routed group over recording members "cpu" and "nccl" of `size` ranks seen from
// `rank`; `cpu` and `nccl` receive their logs.
struct Routed {
  std::shared_ptr<Calls> cpu, nccl;
  std::shared_ptr<ddp::ProcessGroup> pg;
  explicit Routed(int rank = 1, int size = 4) {
    auto host = testing::recording("cpu", rank, size, ddp::detail::Reach::HostAndGpu);
    auto gpu = testing::recording("nccl", rank, size, ddp::detail::Reach::HostAndGpu);
    cpu = host.calls;
    nccl = gpu.calls;
    pg = std::make_shared<ddp::ProcessGroup>(
        ddp::detail::make_routed_backend(std::move(host.backend), std::move(gpu.backend)));
  }
};

float host_data[8];

Buffer host(size_t n = 8) { return Buffer{host_data, n, ddp::DType::F32, Device::Cpu}; }
// Never dereferenced: the recording members only look at the call.
Buffer gpu(size_t n = 8) { return Buffer{reinterpret_cast<void*>(0x1000), n, ddp::DType::F32, Device::Cuda}; }

}  // namespace

TEST_CASE("routed group: host buffers go to the host backend, GPU buffers to the GPU one", "[routed]") {
  auto [cpu, nccl, pg] = Routed();
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
  CHECK(*nccl == Calls{"all_reduce", "reduce", "gather", "reduce_scatter", "send"});
  CHECK(*cpu == Calls{"broadcast", "all_gather", "scatter", "all_to_all", "recv", "barrier"});
}

TEST_CASE("routed group: a non-root gather or scatter goes where the buffer it uses is", "[routed]") {
  auto [cpu, nccl, pg] = Routed();  // this is rank 1; the root is 0
  pg->scatter(host(8), gpu(2), 0);  // the input is the root's side: never read here
  pg->gather(gpu(2), host(8), 0);   // the output is the root's side: never written here
  pg->scatter(gpu(8), host(2), 0);
  pg->gather(host(2), gpu(8), 0);
  CHECK(*nccl == Calls{"scatter", "gather"});
  CHECK(*cpu == Calls{"scatter", "gather"});
}

TEST_CASE("routed group: mixed host and GPU buffers in one call are refused", "[routed]") {
  auto [cpu, nccl, pg] = Routed();
  CHECK_THROWS_AS(pg->all_gather(host(2), gpu(8)), ddp::InvalidArgument);
  CHECK_THROWS_AS(pg->all_to_all(gpu(), host()), ddp::InvalidArgument);
  CHECK(cpu->empty());
  CHECK(nccl->empty());
}

TEST_CASE("routed group: memory, subgroups and abort involve the right members", "[routed]") {
  auto [cpu, nccl, pg] = Routed();
  auto memory = pg->allocate(64);
  REQUIRE(memory);
  CHECK(memory->bytes() == 64);
  CHECK(*cpu == Calls{"allocate"});
  CHECK(nccl->empty());

  auto sub = pg->new_group({3, 1});
  REQUIRE(sub);
  CHECK(sub->backend() == "cpu-sub+nccl-sub");
  CHECK(pg->new_group({0, 2}) == nullptr);  // not a member: both members still took part
  CHECK(*cpu == Calls{"allocate", "new_group", "new_group"});
  CHECK(*nccl == Calls{"new_group", "new_group"});

  pg->abort("test");
  CHECK(cpu->back() == "abort");
  CHECK(nccl->back() == "abort");
}

TEST_CASE("routed group: members that disagree on rank or size are refused", "[routed]") {
  auto cpu = testing::recording("cpu", 1, 4, ddp::detail::Reach::Host);
  auto nccl = testing::recording("nccl", 1, 3, ddp::detail::Reach::Gpu);
  CHECK_THROWS_AS(ddp::detail::make_routed_backend(std::move(cpu.backend), std::move(nccl.backend)),
                  ddp::InvalidArgument);
}
