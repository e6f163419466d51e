// The one argument check (src/process_group.cpp): every caller mistake ProcessGroup
// refuses before a backend sees the call reaches the user the same way, type and
// message, from the real CPU backend (two forked ranks over a real store) and from
// the routed group of backend "auto" (over recording members, which must see
// nothing), and leaves the group usable.
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "group_setup.hpp"
#include "forked_group.hpp"
#include "recording_backend.hpp"

using namespace std::chrono_literals;
using ddp::Buffer;
using ddp::Device;
using ddp::DType;

namespace {

constexpr int kRanks = 2;

using Calls = std::vector<std::string>;
using ddp::detail::Reach;

// A routed group over recording members for host and GPU memory, and their logs.
struct Routed {
  std::shared_ptr<Calls> host, gpu;
  std::shared_ptr<ddp::ProcessGroup> pg;
  explicit Routed(int rank) {
    auto h = testing::recording("recording", rank, kRanks, Reach::Host);
    auto g = testing::recording("recording", rank, kRanks, Reach::Gpu);
    host = h.calls;
    gpu = g.calls;
    pg = std::make_shared<ddp::ProcessGroup>(ddp::detail::make_routed_backend(std::move(h.backend), std::move(g.backend)));
  }
};

float data[16];
int32_t ints[16];
Buffer f32(size_t n) { return Buffer{data, n, DType::F32, Device::Cpu}; }
Buffer i32(size_t n) { return Buffer{ints, n, DType::I32, Device::Cpu}; }

struct Case {
  const char* name;
  std::function<void(ddp::ProcessGroup&)> call;
};

// Mistakes on host buffers, for a group of kRanks seen from rank `me`. Where the
// rule depends on being the root, this rank is the root.
std::vector<Case> mistakes(int me) {
  const int other = 1 - me;
  return {
      {"null buffer", [](auto& pg) { pg.all_reduce(Buffer{nullptr, 4, DType::F32, Device::Cpu}); }},
      {"unknown dtype", [](auto& pg) { pg.all_reduce(Buffer{data, 4, static_cast<DType>(42), Device::Cpu}); }},
      {"unknown reduce op", [](auto& pg) { pg.all_reduce(f32(4), static_cast<ddp::ReduceOp>(9)); }},
      {"broadcast root too large", [](auto& pg) { pg.broadcast(f32(4), kRanks); }},
      {"reduce root negative", [](auto& pg) { pg.reduce(f32(4), -1); }},
      {"all_gather output size", [](auto& pg) { pg.all_gather(f32(4), f32(7)); }},
      {"all_gather dtypes", [](auto& pg) { pg.all_gather(f32(4), i32(8)); }},
      {"gather root output size", [me](auto& pg) { pg.gather(f32(4), f32(3), me); }},
      {"gather root out of range", [](auto& pg) { pg.gather(f32(4), f32(8), kRanks + 3); }},
      {"scatter root input size", [me](auto& pg) { pg.scatter(f32(5), f32(2), me); }},
      {"scatter root dtypes", [me](auto& pg) { pg.scatter(i32(4), f32(2), me); }},
      {"reduce_scatter input size", [](auto& pg) { pg.reduce_scatter(f32(6), f32(2)); }},
      {"all_to_all uneven", [](auto& pg) { pg.all_to_all(f32(5), f32(5)); }},
      {"all_to_all counts differ", [](auto& pg) { pg.all_to_all(f32(4), f32(6)); }},
      {"send to itself", [me](auto& pg) { pg.send(f32(4), me); }},
      {"send out of range", [](auto& pg) { pg.send(f32(4), kRanks); }},
      {"recv out of range", [](auto& pg) { pg.recv(f32(4), -2); }},
      {"recv from itself", [me](auto& pg) { pg.recv(f32(4), me); }},
      {"new_group empty", [](auto& pg) { pg.new_group({}); }},
      {"new_group twice", [other](auto& pg) { pg.new_group({other, other}); }},
      {"new_group out of range", [](auto& pg) { pg.new_group({0, kRanks}); }},
      {"allocate too large", [](auto& pg) { pg.allocate(SIZE_MAX); }},
  };
}

// One line per mistake: its name, the error's type, its message.
std::string transcript(ddp::ProcessGroup& pg) {
  std::string out;
  for (const auto& c : mistakes(pg.rank())) {
    out += std::string(c.name) + " -> ";
    try {
      c.call(pg);
      out += "accepted";
    } catch (const ddp::InvalidArgument& e) {
      out += std::string("InvalidArgument: ") + e.what();
    } catch (const std::exception& e) {
      out += std::string("other error: ") + e.what();
    }
    out += "\n";
  }
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    out.push_back(text.substr(start, nl - start));
  }
  return out;
}

}  // namespace

TEST_CASE("every refused argument reaches the user alike from the cpu backend and the routed group", "[args]") {
  const auto payloads = testing::on_ranks(kRanks, [](ddp::ProcessGroup& pg) {
    std::string out = transcript(pg);
    // Nothing was queued: the group is in step and usable.
    std::vector<float> v(4, 1.0f + static_cast<float>(pg.rank()));
    pg.all_reduce(ddp::view(v));
    out += "after: " + std::to_string(v[0]) + "\n";
    return out;
  });

  for (int rank = 0; rank < kRanks; ++rank) {
    INFO("rank " << rank);
    const auto cpu = lines(payloads[static_cast<size_t>(rank)]);

    auto [host, gpu, routed] = Routed(rank);
    const auto via_router = lines(transcript(*routed));

    REQUIRE(cpu.size() == via_router.size() + 1);
    for (size_t i = 0; i < via_router.size(); ++i) {
      INFO("rank " << rank);
      CHECK(cpu[i] == via_router[i]);
      CHECK(cpu[i].find(" -> InvalidArgument: ") != std::string::npos);
    }
    CHECK(cpu.back() == "after: 3.000000");
    CHECK(host->empty());
    CHECK(gpu->empty());

    // The messages say what was wrong.
    CHECK(via_router[5] == "all_gather output size -> InvalidArgument: all_gather: output holds 7 elements, expected 2 x 4");
    CHECK(via_router[6] == "all_gather dtypes -> InvalidArgument: all_gather: input is f32 but output is i32");
    CHECK(via_router[7] == "gather root output size -> InvalidArgument: gather: the root's output holds 3 elements, "
                           "expected 2 x 4");
    CHECK(via_router[3] == "broadcast root too large -> InvalidArgument: broadcast: root 2 is not a rank of this "
                           "group of 2");
    CHECK(via_router[14] == "send to itself -> InvalidArgument: send: dst " + std::to_string(rank) +
                                " is this rank: a rank cannot address itself");
    CHECK(via_router[19] == "new_group twice -> InvalidArgument: new_group: rank " + std::to_string(1 - rank) +
                                " is listed twice");
  }
}

TEST_CASE("memory a backend cannot reach is refused by name while the router reaches both", "[args]") {
  Buffer gpu_buf{reinterpret_cast<void*>(0x1000), 4, DType::F32, Device::Cuda};
  std::shared_ptr<Calls> host_calls, gpu_calls;
  auto host_only = testing::recording_group("recording", 0, 2, Reach::Host, &host_calls);
  CHECK_THROWS_WITH(host_only->all_reduce(gpu_buf),
                    "all_reduce: buf is GPU memory; the recording backend needs host memory");
  auto gpu_only = testing::recording_group("recording", 0, 2, Reach::Gpu, &gpu_calls);
  CHECK_THROWS_WITH(gpu_only->all_gather(gpu_buf, f32(8)),
                    "all_gather: output is host memory; the recording backend needs GPU memory (Device::Cuda)");
  // Empty buffers are never touched: any memory will do (a non-root's Buffer{}).
  gpu_only->gather(gpu_buf, Buffer{}, 1);
  gpu_only->all_reduce(f32(0));
  CHECK(*gpu_calls == Calls{"gather", "all_reduce"});
  CHECK(host_calls->empty());

  auto [host, gpu, routed] = Routed(0);
  CHECK_THROWS_WITH(routed->all_to_all(gpu_buf, f32(4)),
                    "all_to_all: input and output must both be host memory or both GPU memory");
  routed->all_reduce(gpu_buf);
  routed->all_reduce(f32(4));
  CHECK(*gpu == Calls{"all_reduce"});
  CHECK(*host == Calls{"all_reduce"});
}
