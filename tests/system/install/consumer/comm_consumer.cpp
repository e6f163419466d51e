// Collectives only (ddprun::comm): joins the job, sums (rank + 1) over every rank
// (1 + 2 = 3 with two ranks) and gathers every rank's number. Links no BLAS, zlib or
// cuBLAS: the install test checks its link line.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "ddp/init.hpp"

int main() {
  try {
    // The CPU backend: the buffers are host memory, and "auto" would pick NCCL on a GPU machine.
    ddp::InitOptions options;
    options.backend = "cpu";
    auto pg = ddp::init(options);
    std::vector<int32_t> v{pg->rank() + 1};
    pg->all_reduce(ddp::view(v));
    std::vector<int32_t> mine{pg->rank() * 10};
    std::vector<int32_t> all(static_cast<size_t>(pg->size()));
    pg->all_gather(ddp::view(mine), ddp::view(all));
    std::printf("comm consumer rank %d of %d: sum %d, gathered", pg->rank(), pg->size(), static_cast<int>(v[0]));
    for (int32_t x : all) std::printf(" %d", static_cast<int>(x));
    std::printf("\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm consumer: %s\n", e.what());
    return 1;
  }
}
