// The whole runtime (ddprun::worker = comm + train): wraps a small MLP, initialised
// differently on each rank, in DistributedDataParallel (which copies rank 0's values
// to every rank) and takes this rank's share of a 10-sample dataset from the
// DistributedSampler. Every rank prints the same parameter checksum.
#include <cstdint>
#include <cstdio>
#include <exception>

#include "ddp/distributed_data_parallel.hpp"
#include "ddp/init.hpp"
#include "ddp/sampler.hpp"

int main() {
  try {
    // The CPU backend: the model lives in host memory, and "auto" would pick NCCL on a GPU machine.
    ddp::InitOptions options;
    options.backend = "cpu";
    auto pg = ddp::init(options);
    auto model = ddp::make_mlp({.sizes = {4, 3, 2}, .seed = static_cast<uint64_t>(pg->rank())});
    ddp::DistributedDataParallel ddp_model(*model, pg);
    double checksum = 0;
    for (auto* p : model->parameters()) {
      for (float x : p->value.span()) checksum += x;
    }
    ddp::DistributedSampler sampler(10, {.num_replicas = static_cast<size_t>(pg->size()),
                                         .rank = static_cast<size_t>(pg->rank()),
                                         .shuffle = false});
    std::printf("consumer rank %d of %d: parameters %.6f, samples", pg->rank(), pg->size(), checksum);
    for (size_t i : sampler.indices()) std::printf(" %zu", i);
    std::printf("\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
