// linear: the smallest data-parallel training program. A Linear(10, 2) classifier,
// softmax cross-entropy, SGD (lr 0.01), batch 64 per worker, 2 epochs, on a
// synthetic dataset every rank generates from the same seed; rank 0 prints the loss.
//
//   ddprun --nproc_per_node=2 build/examples/linear/linear
#include <cstdio>
#include <vector>

#include "ddp/distributed_data_parallel.hpp"  // DistributedDataParallel
#include "ddp/init.hpp"                       // ddp::init
#include "ddp/nn.hpp"                         // Linear, softmax_cross_entropy
#include "ddp/optim.hpp"                      // SGD
#include "ddp/sampler.hpp"                    // DistributedSampler

int main() {
  try {
    auto pg = ddp::init();
    // Data: 4096 points in [-1, 1)^10; the label says whether the first five
    // features outweigh the last five (a linearly separable rule).
    constexpr size_t kSamples = 4096, kFeatures = 10, kBatch = 64;
    ddp::Rng data_rng(1234);
    ddp::Tensor xs(kSamples, kFeatures);
    std::vector<int32_t> ys(kSamples);
    for (size_t i = 0; i < kSamples; ++i) {
      float margin = 0;
      for (size_t f = 0; f < kFeatures; ++f) {
        xs(i, f) = data_rng.uniform(-1.0f, 1.0f);
        margin += f < 5 ? xs(i, f) : -xs(i, f);
      }
      ys[i] = margin > 0 ? 1 : 0;
    }

    ddp::Rng init_rng(0);
    ddp::Sequential model;
    model.add<ddp::Linear>(ddp::LinearOptions{.in_features = kFeatures, .out_features = 2}, init_rng, "0.");
    ddp::DistributedDataParallel ddp_model(model, pg);
    ddp::SGD opt(model.parameters(), {.lr = 0.01f});
    ddp::DistributedSampler sampler(kSamples, {.num_replicas = static_cast<size_t>(pg->size()),
                                               .rank = static_cast<size_t>(pg->rank()),
                                               .seed = 0});
    ddp::Tensor x, dlogits;
    std::vector<int32_t> y;
    for (int epoch = 0; epoch < 2; ++epoch) {
      sampler.set_epoch(static_cast<uint64_t>(epoch));
      const auto order = sampler.indices();
      double loss_sum = 0;
      size_t steps = 0;
      for (size_t b = 0; b < order.size(); b += kBatch) {
        std::span<const size_t> idx(order.data() + b, std::min(kBatch, order.size() - b));
        ddp::gather_rows(xs, idx, x);
        y.assign(idx.size(), 0);
        for (size_t i = 0; i < idx.size(); ++i) y[i] = ys[idx[i]];
        const float loss = ddp::softmax_cross_entropy(ddp_model.forward(x), y, dlogits);
        ddp_model.backward(dlogits);
        opt.step();
        ddp_model.zero_grad();
        loss_sum += loss;
        ++steps;
      }
      // The mean loss over every rank's batches.
      double sums[2] = {loss_sum, static_cast<double>(steps)};
      pg->all_reduce(ddp::view(std::span<double>(sums, 2)));
      if (pg->rank() == 0) std::printf("epoch %d loss %.4f\n", epoch + 1, sums[0] / sums[1]);
    }
    return 0;
  } catch (const ddp::contract::ContractError& e) {
    std::fprintf(stderr, "linear: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "linear: %s\n", e.what());
    return 1;
  }
}
