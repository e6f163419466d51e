// Joins the job and sums (rank + 1) over every rank: 1 + 2 = 3 with two ranks.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "ddp/init.hpp"

int main() {
  try {
    // The CPU backend: the buffer is host memory, and "auto" would pick NCCL on a GPU machine.
    ddp::InitOptions options;
    options.backend = "cpu";
    auto pg = ddp::init(options);
    std::vector<int32_t> v{pg->rank() + 1};
    pg->all_reduce(ddp::view(v));
    std::printf("consumer rank %d of %d: sum %d\n", pg->rank(), pg->size(), static_cast<int>(v[0]));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
