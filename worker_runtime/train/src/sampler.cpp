// DistributedSampler (torch.utils.data.distributed.DistributedSampler semantics).
#include "ddp/sampler.hpp"

#include <numeric>
#include <string>
#include <utility>

#include "ddp/random.hpp"
#include "ddp/types.hpp"

namespace ddp {

DistributedSampler::DistributedSampler(size_t dataset_size, const DistributedSamplerOptions& options)
    : dataset_size_(dataset_size), options_(options) {
  const size_t r = options.num_replicas;
  if (r == 0) throw InvalidArgument("DistributedSampler: num_replicas is 0");
  if (options.rank >= r) {
    throw InvalidArgument("DistributedSampler: rank " + std::to_string(options.rank) + " >= num_replicas " +
                          std::to_string(r));
  }
  // torch: drop_last and N % R != 0 → ceil((N - R) / R), which is floor(N / R);
  // otherwise ceil(N / R).
  num_samples_ = options.drop_last ? dataset_size / r : (dataset_size + r - 1) / r;
}

std::vector<size_t> DistributedSampler::indices() const {
  const size_t n = dataset_size_, r = options_.num_replicas, total = total_size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  if (options_.shuffle && n > 1) {  // Fisher-Yates from a generator seeded by seed + epoch only
    Rng rng(options_.seed + epoch_);
    for (size_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  }
  // Pad by repeating from the start (cycling through the whole list when the
  // padding is longer than it), or truncate for drop_last; then take every r-th.
  std::vector<size_t> mine;
  mine.reserve(num_samples_);
  for (size_t k = options_.rank; k < total; k += r) mine.push_back(order[k % n]);
  return mine;
}

}  // namespace ddp
