// DistributedSampler: which dataset indices each rank visits in an epoch, with the
// semantics of torch.utils.data.distributed.DistributedSampler.
//
// The dataset's indices (shuffled or not) are made divisible by the number of
// replicas, then rank r takes every num_replicas-th index starting at r:
//   - drop_last = false: total = ceil(N / R) * R; the list is padded by repeating
//     indices from its start (repeating the whole list as often as needed);
//   - drop_last = true:  total = floor(N / R) * R; the tail is dropped.
// Every rank gets exactly size() indices, the ranks' lists are disjoint (up to the
// padding) and together cover the dataset. The shuffle is a Fisher-Yates
// permutation from ddp::Rng seeded with seed + epoch: it depends only on
// (seed, epoch), so every rank computes the same one. (It is not torch's
// permutation, which comes from torch.randperm.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {

struct DistributedSamplerOptions {
  size_t num_replicas = 1;  // world size
  size_t rank = 0;          // this replica, 0 .. num_replicas-1
  bool shuffle = true;
  uint64_t seed = 0;        // must be equal on every rank
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Throws InvalidArgument when num_replicas is 0 or rank >= num_replicas.
  DistributedSampler(size_t dataset_size, const DistributedSamplerOptions& options);

  // Selects the shuffle of an epoch; call it before each epoch (as with torch),
  // otherwise every epoch repeats epoch 0's order.
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch, in visiting order (size() of them).
  std::vector<size_t> indices() const;
  // Indices per rank per epoch (torch's num_samples).
  size_t size() const { return num_samples_; }
  // size() * num_replicas: the padded (or truncated) length of the global list.
  size_t total_size() const { return num_samples_ * options_.num_replicas; }
  size_t dataset_size() const { return dataset_size_; }

 private:
  size_t dataset_size_;
  DistributedSamplerOptions options_;
  size_t num_samples_;
  uint64_t epoch_ = 0;
};

}  // namespace ddp
